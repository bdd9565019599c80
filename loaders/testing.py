"""Conformance tests for sample types, shipped with the package so that a plug-in outside this
repository can subclass them (the way zarr ships ``zarr.testing.StoreTests`` for third-party
stores).

Only test suites import this module: it imports pytest and hypothesis (dev dependencies), and no
product code may import it. A subclass of :class:`SampleTypeTests` sets ``name`` (and ``options``),
provides a ``dataset`` fixture (a built dataset folder) and ``unit_keys`` (a batch -> one hashable
key per unit), and may override :meth:`SampleTypeTests.reference_units` with values computed
independently of the sample type."""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loaders import format as fmt
from loaders import plugins
from loaders.format.readers import read_shard
from loaders.format.validate import validate_columns
from loaders.samples import SAMPLE_TYPES, from_config, get_sample_type

if TYPE_CHECKING:
    from loaders.dataset import ShardDataset

EXAMPLES = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
)


class SampleTypeTests:
    """What every sample type owes the loader: registration and a JSON config round trip, unit
    counts equal to those the pipeline recorded in the index, index order with ``shuffle=False``,
    and every unit exactly once per epoch across ranks, in equal shares, in an order that is a pure
    function of (seed, epoch, world size). Reads with ``decode_process=False`` (the decoder process
    is the loader's business, tested with the loader)."""

    name: ClassVar[str]
    options: ClassVar[dict[str, Any]] = {}
    split: ClassVar[str] = "train"

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        """One hashable key per unit of ``batch`` (e.g. its ``sample_id``), unique within a split."""
        raise NotImplementedError

    def reference_units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """Override: the units of one shard (``columns`` as stored), int64 ``[U, width]``, computed
        independently of the sample type's own ``units`` (by hand from the format's columns, or
        from your source files). The default, None, skips the one test that compares against it:
        without an independent reference, the other tests only check the sample type against
        itself."""
        return None

    def make(self, root: Path, **kw: Any) -> ShardDataset:
        from loaders.dataset import ShardDataset  # here: pipeline.testing imports us, torch-free

        return ShardDataset(
            root, split=self.split, sample=self.name, decode_process=False, **self.options, **kw
        )

    def keys(self, ds: ShardDataset, epoch: int = 0) -> list[Hashable]:
        ds.set_epoch(epoch)
        return [k for b in ds for k in self.unit_keys(b)]

    def _everything(self, dataset: Path) -> list[Hashable]:
        """Every unit of the split in index order, read once per test (Hypothesis runs each example
        on the same instance, and this list depends on none of the drawn values)."""
        cache = self.__dict__.setdefault("_everything_of", {})
        if dataset not in cache:
            cache[dataset] = self.keys(self.make(dataset, batch_size=7, shuffle=False))
        return cache[dataset]

    def _shards(self, dataset: Path) -> Iterable[tuple[fmt.ShardEntry, dict[str, np.ndarray]]]:
        index = fmt.read_index(dataset)
        for entry in index.shards:
            keys = fmt.shard_keys(index.fields, index.tables)
            yield entry, read_shard(index.shard_path(entry), index.encoding, keys)

    def test_registered_and_config_round_trips(self) -> None:
        st_ = get_sample_type(self.name, **self.options)
        config = json.loads(json.dumps(st_.get_config()))  # JSON-able
        assert from_config(config) == st_ and type(from_config(config)) is SAMPLE_TYPES[self.name]

    def test_units_match_the_index(self, dataset: Path) -> None:
        index = fmt.read_index(dataset)
        st_ = get_sample_type(self.name, **self.options)
        st_.bind(index)
        assert self.name in index.samples
        for entry, cols in self._shards(dataset):
            units = st_.units(cols)
            n = validate_columns(cols, index.fields, index.tables)
            assert units.ndim == 2 and units.dtype == np.int64
            assert units.size == 0 or (units.min() >= 0 and units.max() < n)
            assert st_.count(cols) == units.shape[0] == entry.units[self.name]

    def test_units_match_the_reference(self, dataset: Path) -> None:
        st_ = get_sample_type(self.name, **self.options)
        st_.bind(fmt.read_index(dataset))
        compared = 0
        for entry, cols in self._shards(dataset):
            want = self.reference_units(cols)
            if want is None:
                pytest.skip(f"{type(self).__name__} has no reference_units")
            got = st_.units(cols)
            np.testing.assert_array_equal(
                got, np.asarray(want, np.int64), strict=True, err_msg=f"units of {entry.file}"
            )
            compared += 1
        assert compared > 0

    def test_shuffle_false_is_index_order_and_repeatable(self, dataset: Path) -> None:
        a = self.keys(self.make(dataset, batch_size=3, shuffle=False))
        b = self.keys(self.make(dataset, batch_size=5, shuffle=False), epoch=2)
        assert a == b and len(a) == len(set(a)) > 0

    @EXAMPLES
    @given(
        world=st.integers(1, 3),
        batch=st.integers(1, 6),
        seed=st.integers(0, 3),
        epoch=st.integers(0, 3),
    )
    def test_ranks_share_an_epoch_exactly_once(
        self, dataset: Path, world: int, batch: int, seed: int, epoch: int
    ) -> None:
        per_rank = [
            self.keys(
                self.make(
                    dataset, batch_size=batch, seed=seed, rank=r, world_size=world, pad=False
                ),
                epoch,
            )
            for r in range(world)
        ]
        everything = self._everything(dataset)
        flat = [k for keys in per_rank for k in keys]
        assert len(flat) == len(set(flat))  # disjoint, no repeats
        assert set(flat) <= set(everything) and len(flat) == len(everything) // world * world
        assert len({len(k) for k in per_rank}) == 1  # equal share per rank
        again = self.keys(
            self.make(dataset, batch_size=batch, seed=seed, rank=0, world_size=world, pad=False),
            epoch,
        )
        assert again == per_rank[0]  # a pure function of (seed, epoch, world)


def in_modules(module: str, prefixes: Iterable[str]) -> bool:
    """Whether ``module`` is one of ``prefixes`` or inside one (``a.b`` is in ``a``; ``ab`` is not)."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def modality_module_names(build: bool = False) -> list[str]:
    """The module of every installed modality (entry-point group ``shardsmith.modalities``),
    imported, and with ``build`` each one's ``BUILD_MODULE`` too: where a registered type may come
    from besides this package. Not cached (a test may fake the entry points)."""
    names = []
    for _, module in plugins.modality_modules():  # looked up here: a test may fake it
        names.append(module)
        target = getattr(plugins.load_plugin(module, build=build), "BUILD_MODULE", None)
        if build and target:
            names.append(target)
    return names


def uncovered_sample_types(
    covered: Iterable[str], prefixes: Iterable[str] = ("loaders",)
) -> list[str]:
    """Registered sample types defined in ``prefixes`` or in an installed modality's module that are
    not among ``covered`` (names with a :class:`SampleTypeTests` subclass)."""
    where = (*prefixes, *modality_module_names())
    ours = {n for n, c in SAMPLE_TYPES.load_all().items() if in_modules(c.__module__, where)}
    return sorted(ours - set(covered))
