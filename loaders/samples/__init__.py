"""Sample types: what one *unit* of an epoch is and how a batch of units is assembled (no torch
here).

A sample type is the loader half of a modality (the pipeline half is a kind, ``pipeline.kinds``). It
says

* which record fields and shard tables it reads (:meth:`SampleType.fields`,
:attr:`SampleType.tables`);
* what its units are in a shard (:meth:`SampleType.units`: ``[U, width]`` local rows; a cell is one
row, a pair
  two, a sentence ``2L``). The pipeline counts them when it packs a shard
  (``ShardEntry.units[name]``), so the
  loader plans epochs from ``index.json`` alone and checks every shard's count before serving it;
* how a batch is assembled from gathered rows (:meth:`SampleType.assemble`), using one gather
function per
  field layout (dense, csr, ragged) shared by every sample type (``loaders.samples.gather``).

Load-time options (``num_bins=5``, ``crop=(256, 256)``...) are keyword arguments of the
constructor, validated there; :meth:`get_config` / :func:`from_config` round-trip them through
JSON (the decoder process rebuilds the same sample type from that config; nothing is pickled). A
plug-in defined outside this package is found by its module name, which the config carries.

Options that only change the form a batch's deferred items are delivered in (dense values or their
parts, say) are listed in :attr:`SampleType.delivery_options`: they do not decide which units form
a batch, so a resume state ignores them (:meth:`SampleType.order_config`).

Per-unit randomness (a crop, a flip) comes from :func:`unit_hash` / :func:`unit_draws`: a pure
function of ``(seed, epoch, unit id)``, so a unit's draw does not depend on its batch, worker or
rank, and a resumed epoch draws what the interrupted one would have.

Registry in the style of numcodecs: :func:`register_sample_type` / :func:`get_sample_type`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from loaders.format import Index
from loaders.format.values import ShardEntry
from loaders.plugins import load_loader_modalities, load_plugin
from loaders.plugins.registry import Registry

if TYPE_CHECKING:
    from loaders.samples.gather import BatchRows
    from loaders.samples.payload import Payload


class SampleType(ABC):
    """One way of iterating a dataset. Subclasses set :attr:`name` (and :attr:`tables`), and
    implement
    :meth:`fields`, :meth:`units` and :meth:`assemble`. Instances are cheap and hold only JSON-able
    options plus what :meth:`bind` derives from the index."""

    name: ClassVar[str]
    tables: ClassVar[
        tuple[str, ...]
    ] = ()  # shard tables it reads (units of most types refer to them)
    budget: int | None = (
        None  # set: batches hold units up to this total cost (unit_costs) instead of batch_size
    )
    # options that choose only how deferred items reach the user, not which units a batch holds
    delivery_options: ClassVar[tuple[str, ...]] = ()
    # a ragged uint8 field of each record's name (UTF-8), what ``obs_names_for`` reads; None: none
    record_names: ClassVar[str | None] = None

    def __init__(self, **options: Any) -> None:
        if options:
            raise TypeError(f"sample type {self.name!r} takes no option {sorted(options)[0]!r}")

    # -- configuration
    # ------------------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """JSON-able ``{"name", "module", **options}``; ``from_config(get_config())`` is an equal
        instance."""
        return {"name": self.name, "module": type(self).__module__, **self.options()}

    def options(self) -> dict[str, Any]:
        """The load-time options this instance was made with (JSON-able). Override with the
        constructor."""
        return {}

    def order_config(self) -> dict[str, Any]:
        """:meth:`get_config` without the :attr:`delivery_options`: what decides the batches (a
        resume state stores and compares this)."""
        return {k: v for k, v in self.get_config().items() if k not in self.delivery_options}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SampleType) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(self.name)

    # -- the dataset
    # --------------------------------------------------------------------------------
    @abstractmethod
    def fields(self, index: Index) -> list[str]:
        """Names of the record fields it reads (each declared in ``index.fields``)."""

    def check(self, index: Index) -> None:
        """Raise ValueError naming what this dataset lacks for this sample type (a field, a table, a
        count)."""
        have = {f.name for f in index.fields}
        missing = [f for f in self.fields(index) if f not in have]
        missing += [t for t in self.tables if t not in index.tables]
        if missing:
            raise ValueError(
                f"sample={self.name!r} needs {missing}, which {index.root} ({index.kind}) does not have"
            )
        if index.samples and self.name not in index.samples:
            raise ValueError(
                f"sample={self.name!r}: {index.root} counts units only for {index.samples}"
            )

    def bind(self, index: Index) -> None:  # noqa: B027 - optional hook
        """Derive what :meth:`assemble` needs from the index (sizes, vocabularies, side tables'
        paths)."""

    def field_bounds(self, index: Index) -> dict[str, int]:
        """Exclusive upper bounds of integer fields it reads beyond each field's own ``bound`` (e.g.
        codes into a vocabulary of the index: a code past it would be served without a label).
        Checked wherever a shard is read, whatever ``index.json`` says."""
        return {}

    # -- a shard
    # ------------------------------------------------------------------------------------
    @abstractmethod
    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """Local rows of this shard's units, int64 ``[U, width]``, in unit order (``columns``: the
        shard's columns as stored; at least the fields and tables this type reads)."""

    def check_columns(self, columns: Mapping[str, np.ndarray], name: str) -> None:  # noqa: B027 - optional hook
        """Checks beyond the schema's (``validate_columns``) before a shard is served; raise
        FormatError naming ``name`` (the shard)."""

    def unit_costs(self, entries: Sequence[ShardEntry]) -> list[np.ndarray]:
        """With a :attr:`budget`: each unit's cost, per shard, from ``index.json`` alone (e.g. a
        volume's point count)."""
        raise NotImplementedError(f"sample type {self.name!r} has no unit costs (budget batching)")

    def count(self, columns: Mapping[str, np.ndarray]) -> int:
        """Units in a shard (what ``ShardEntry.units[name]`` records)."""
        return int(self.units(columns).shape[0])

    # -- a batch
    # ------------------------------------------------------------------------------------
    @abstractmethod
    def assemble(self, batch: BatchRows) -> Payload:
        """The batch of ``batch.units`` (arena rows ``[b, width]``, in batch order): gather each
        field with the layout's gather function and return numpy arrays plus deferred
        (device-finishable) parts."""


# -- per-unit randomness ----------------------------------------------------------------------
_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's step and finaliser: a well-mixed uint64 of each uint64 (vectorised, the same
    everywhere)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, np.uint64) + _GAMMA
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def unit_hash(seed: int, epoch: int, ids: np.ndarray) -> np.ndarray:
    """uint64, the shape of ``ids``: a hash of ``(seed, epoch, id)`` per unit (``batch.seed``,
    ``batch.epoch``, ``batch.unit_ids`` or another stable id such as a sample id). A unit's value
    depends on nothing else (not its batch, worker or rank), and costs no generator per unit
    (seeding a numpy Generator: ~15 us)."""
    ids = np.asarray(ids)
    key = mix64(mix64(np.full(1, seed, np.uint64)) ^ np.uint64(epoch))
    return mix64(key ^ ids.astype(np.uint64))


def unit_draws(seed: int, epoch: int, ids: np.ndarray, count: int) -> np.ndarray:
    """uint64 ``[len(ids), count]``: ``count`` independent draws per unit, the splitmix64 sequence
    started at its :func:`unit_hash` (draw ``k`` of a unit never depends on ``count``). ``draws %
    n`` is an integer in ``[0, n)`` (bias below ``n / 2**64``); ``draws >> 63`` a fair bit."""
    h = unit_hash(seed, epoch, np.asarray(ids).reshape(-1))
    with np.errstate(over="ignore"):
        steps = np.arange(count, dtype=np.uint64) * _GAMMA
        return mix64(h[:, None] + steps[None, :])


SAMPLE_TYPES: Registry[type[SampleType]] = Registry("sample type", discover=load_loader_modalities)


def register_sample_type(cls: type[SampleType]) -> type[SampleType]:
    """Class decorator: make ``cls`` available as ``sample=cls.name``."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} has no sample type name")
    old = SAMPLE_TYPES.peek(name)
    if (
        old is not None
        and old is not cls
        and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__)
    ):
        raise ValueError(
            f"sample type {name!r} is already registered by {old.__module__}.{old.__qualname__}"
        )
    return SAMPLE_TYPES.register(name, cls)


def get_sample_type(name: str, **options: Any) -> SampleType:
    """An instance of the registered sample type ``name`` with load-time ``options``."""
    return SAMPLE_TYPES.get(name)(**options)


def check_sample_type(sample: SampleType, index: Index) -> None:
    """``sample.check(index)``, after the one check every sample type shares: that the dataset
    serves it. A sample type's own checks read what its modality stores (a field, a section), and
    on another kind's dataset they would fail on the first absent key (``KeyError: 'spikes'``)
    instead of saying that the dataset is of another kind and which sample types it serves."""
    served = f"{index.root} is a {index.kind!r} dataset, " + (
        f"which serves the sample types {index.samples}"
        if index.samples
        else "whose index lists no sample types"
    )
    if index.samples and sample.name not in index.samples:
        raise ValueError(
            f"sample={sample.name!r}: {served}; pass one of them as sample=..., or none for "
            f"{index.samples[0]!r}"
        )
    try:
        sample.check(index)
    except KeyError as e:  # a check reading what the dataset lacks (an index without samples)
        raise ValueError(f"sample={sample.name!r} needs {e}, which it lacks: {served}") from None


def from_config(config: Mapping[str, Any] | str) -> SampleType:
    """Rebuild a sample type from :meth:`SampleType.get_config` (importing its module if it is a
    plug-in); a bare name means the type with its default options."""
    config = {"name": config} if isinstance(config, str) else dict(config)
    name, module = str(config.pop("name")), config.pop("module", None)
    if name not in SAMPLE_TYPES and module:
        load_plugin(str(module), needed_by=f"sample type {name!r}")
    return get_sample_type(name, **config)
