"""Conformance of sample types: one reusable class, :class:`SampleTypeTests`, that every registered sample
type subclasses (as the encodings do in test_encodings.py). A subclass sets ``name`` (and ``options``) and
provides a ``dataset`` fixture (a built dataset folder) and ``unit_keys`` (a batch -> one hashable key per unit).
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loaders import ShardDataset
from loaders import format as fmt
from loaders.columns import validate_columns
from loaders.samples import SAMPLE_TYPES, from_config, get_sample_type
from loaders.shardio import read_shard
from tests import plugin_toy  # noqa: F401  (registers the test-only "toyvec" sample type)

HERE = Path(__file__).resolve().parent
EXAMPLES = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                               HealthCheck.differing_executors])


class SampleTypeTests:
    name: ClassVar[str]
    options: ClassVar[dict[str, Any]] = {}
    split: ClassVar[str] = "train"

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        raise NotImplementedError

    def make(self, root: Path, **kw: Any) -> ShardDataset:
        return ShardDataset(root, split=self.split, sample=self.name, decode_process=False, **self.options, **kw)

    def keys(self, ds: ShardDataset, epoch: int = 0) -> list[Hashable]:
        ds.set_epoch(epoch)
        return [k for b in ds for k in self.unit_keys(b)]

    def test_registered_and_config_round_trips(self) -> None:
        st_ = get_sample_type(self.name, **self.options)
        config = json.loads(json.dumps(st_.get_config()))  # JSON-able
        assert from_config(config) == st_ and type(from_config(config)) is SAMPLE_TYPES[self.name]

    def test_units_match_the_index(self, dataset: Path) -> None:
        index = fmt.read_index(dataset)
        st_ = get_sample_type(self.name, **self.options)
        st_.bind(index)
        assert self.name in index.samples
        for entry in index.shards:
            cols = read_shard(index.shard_path(entry), index.encoding, fmt.shard_keys(index.fields, index.tables))
            units = st_.units(cols)
            n = validate_columns(cols, index.fields, index.tables)
            assert units.ndim == 2 and units.dtype == np.int64
            assert units.size == 0 or (units.min() >= 0 and units.max() < n)
            assert st_.count(cols) == units.shape[0] == entry.units[self.name]

    def test_shuffle_false_is_index_order_and_repeatable(self, dataset: Path) -> None:
        a = self.keys(self.make(dataset, batch_size=3, shuffle=False))
        b = self.keys(self.make(dataset, batch_size=5, shuffle=False), epoch=2)
        assert a == b and len(a) == len(set(a)) > 0

    @EXAMPLES
    @given(world=st.integers(1, 3), batch=st.integers(1, 6), seed=st.integers(0, 3), epoch=st.integers(0, 3))
    def test_ranks_share_an_epoch_exactly_once(self, dataset: Path, world: int, batch: int, seed: int,
                                               epoch: int) -> None:
        per_rank = [self.keys(self.make(dataset, batch_size=batch, seed=seed, rank=r, world_size=world, pad=False),
                              epoch) for r in range(world)]
        everything = self.keys(self.make(dataset, batch_size=7, shuffle=False))
        flat = [k for keys in per_rank for k in keys]
        assert len(flat) == len(set(flat))  # disjoint, no repeats
        assert set(flat) <= set(everything) and len(flat) == len(everything) // world * world
        assert len({len(k) for k in per_rank}) == 1  # equal share per rank
        again = self.keys(self.make(dataset, batch_size=batch, seed=seed, rank=0, world_size=world, pad=False), epoch)
        assert again == per_rank[0]  # a pure function of (seed, epoch, world)


# -- the built-in and test-only sample types ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def perturbation_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.shard_fixtures import make_dataset

    return make_dataset(tmp_path_factory.mktemp("conf"), n_shards=4, cells_per_shard=60).root


class _Perturbation(SampleTypeTests):
    @pytest.fixture
    def dataset(self, perturbation_fixture: Path) -> Path:
        return perturbation_fixture


class TestCells(_Perturbation):
    name = "cells"

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return batch["sample_id"].tolist()


class TestPairs(_Perturbation):
    name = "pairs"

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return list(zip(batch["ctrl_id"].tolist(), batch["pert_id"].tolist(), strict=True))


class TestSentences(_Perturbation):
    name = "sentences"

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return [tuple(r) for r in batch["pert_id"].tolist()]


class TestToy(SampleTypeTests):
    name = "toyvec"

    @pytest.fixture(scope="class")
    def dataset(self, tmp_path_factory: pytest.TempPathFactory) -> Path:
        from pipeline.build import build
        from tests.plugin_toy import write_toy
        from tests.test_kinds import MANIFEST, _records

        root = tmp_path_factory.mktemp("toyconf")
        (root / "src").mkdir()
        write_toy(root / "src" / "a.toy", _records(1, 30, 5))
        (root / "m.toml").write_text(MANIFEST.format(fmt="tar", ragged="true"))
        build(root / "m.toml", root / "out", jobs=1, progress=False)
        return root / "out"

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return batch["sample_id"].tolist()


def test_every_registered_sample_type_has_a_conformance_subclass() -> None:
    import pipeline.model  # noqa: F401  (the kinds registry: its discovery registers every sample type)
    import tests.plugin_toy  # noqa: F401
    from pipeline.model import kind_names

    kind_names()  # imports the built-in kinds and with them their sample types
    text = "\n".join(p.read_text() for p in HERE.glob("test_*.py"))
    covered = set(re.findall(r'^class \w+\([\w.]*(?:SampleTypeTests|_Perturbation)\):\n    name = "(\w+)"', text, re.M))
    ours = {n for n, c in SAMPLE_TYPES.items() if c.__module__.startswith(("loaders.", "tests."))}
    missing = sorted(ours - covered)
    assert not missing, f"sample types without a SampleTypeTests subclass: {missing}"
