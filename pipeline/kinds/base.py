"""Dataset kinds: what a manifest's ``kind`` selects, and the contract ``build`` works through.

A kind owns its manifest sections (parsed and validated by :meth:`Kind.parse`, errors naming the key), its
record schema (``FieldSpec`` s and shard tables, with ``bound`` s for codes), the sample types its shards serve
(their units are counted at pack time with ``loaders.samples``), its scan and planner (which records go to
which shard and split, side tables), how its shards are packed, what it adds to ``index.json``, its extra
``verify`` checks and what ``inspect`` says. ``build``, ``verify``, ``incremental`` and ``inspect`` only call
these methods and read the typed :class:`KindPlan`; they never name a kind's columns.

Registry in the style of numcodecs: :func:`register_kind` / :func:`get_kind`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from loaders import format as fmt

if TYPE_CHECKING:
    from pipeline.manifest import Manifest
    from pipeline.pack import PackConfig
    from pipeline.scan import ScannedSource

Task = Callable[[], Any]


@dataclass
class ShardPlan:
    """One shard to write: its split, its source (-1 if mixed), its number within (source, split), the rows or
    records it holds in shard order, and the columns the planner already made (a column may be parked in a
    ``.npy`` file between planning and packing)."""

    split: str
    source: int
    part: int
    rows: np.ndarray  # source rows (perturbation: int32 below 2**31) or record numbers (int64), in shard order
    columns: dict[str, np.ndarray | Path]
    key: str = ""

    @property
    def file(self) -> str:
        return f"{self.split}-{self.source if self.source >= 0 else 999:03d}-{self.part:03d}-{self.key[:16]}"

    @property
    def n(self) -> int:
        return int(self.rows.shape[0])


@dataclass
class PackResult:
    """What one pack task reports for one shard: its entry, records it skipped (reason -> count), the
    kind's per-record metadata (JSON-able, stored under ``sections[kind]["records"][file]``) and counts of
    values it changed to keep them exact (name -> count, summed into the index stats under that name)."""

    number: int
    entry: fmt.ShardEntry
    skipped: dict[str, int] = field(default_factory=dict)
    records: list[Any] | None = None
    counts: dict[str, int] = field(default_factory=dict)  # values made exact, e.g. duplicate entries summed


@dataclass
class KindPlan:
    """The planner's typed output: everything ``build`` needs to pack and commit."""

    shards: list[ShardPlan]
    fields: tuple[fmt.FieldSpec, ...]
    tables: tuple[str, ...]
    conditions: dict[str, np.ndarray] | None = None  # the condition table's columns, if the kind has one
    condition_segments: list[Any] = field(default_factory=list)  # which field fills which vector columns
    vocabularies: dict[str, list[str]] = field(default_factory=dict)
    obs_fields: list[str] = field(default_factory=list)
    control_labels: list[str] = field(default_factory=list)
    section: dict[str, Any] = field(default_factory=dict)  # sections[kind] of the index (settings, not data)
    stats: dict[str, Any] = field(default_factory=dict)
    primary_records: int | None = None  # None: the sum of the shards' records once packed
    source_keys: list[str] = field(default_factory=list)  # per source: what its shards depend on (incremental)
    source_stats: list[dict[str, int]] = field(default_factory=list)
    extra: Any = None  # the kind's own planning state, handed back to its pack_tasks


@dataclass
class PlanContext:
    """What the build hands the planner: where big tables may be parked, which shards can be reused, what an
    earlier build planned per source (``known``), and the code digest (``salt``)."""

    park: Callable[[ShardPlan], None] | None = None
    known: Mapping[str, tuple[list[ShardPlan], dict[str, int]]] | None = None
    salt: str = ""
    previous: fmt.Index | None = None


class Kind(ABC):
    """One kind of dataset. Subclasses set :attr:`name`, :attr:`sections` and :attr:`samples`."""

    name: ClassVar[str]
    sections: ClassVar[tuple[str, ...]] = ()  # manifest tables this kind owns
    samples: ClassVar[tuple[str, ...]] = ()  # sample types its shards serve
    parked: ClassVar[tuple[str, ...]] = ()  # planned columns parked in spill files until their shard is packed
    resumable: ClassVar[bool] = False  # a pack result is the index entry alone: finished shards can be adopted

    @abstractmethod
    def parse(self, path: Path, sections: Mapping[str, Any]) -> Any:
        """Validate the kind's manifest tables (``sections[name]`` is None when absent) into a typed config."""

    def source_defaults(self, config: Any) -> dict[str, Any]:
        """Defaults for ``[[sources]]`` keys (e.g. the matrix for matrix sources)."""
        return {}

    def pack_options(self, manifest: Manifest) -> dict[str, Any]:
        """Kind-specific ``PackConfig`` settings."""
        return {}

    def input_files(self, manifest: Manifest) -> list[Path]:
        """Files besides the sources whose content the shards depend on (part of the no-change check)."""
        return []

    @abstractmethod
    def scan(self, manifest: Manifest, cache: Mapping[str, Mapping[str, object]] | None,
             hasher: Executor | None) -> list[ScannedSource]:
        """Fingerprint the sources and read their metadata; fail early naming the file."""

    @abstractmethod
    def plan(self, manifest: Manifest, scanned: Sequence[ScannedSource], ctx: PlanContext) -> KindPlan:
        """The plan: a pure function of (manifest, seed, scanned sources)."""

    @abstractmethod
    def pack_tasks(self, manifest: Manifest, plan: KindPlan, scanned: Sequence[ScannedSource], todo: Sequence[int],
                   cfg: PackConfig) -> tuple[list[Task], list[Task]]:
        """Tasks of two phases, each returning a list of :class:`PackResult` (phase 1 may return [])."""

    def check_shard(self, index: fmt.Index, columns: Mapping[str, np.ndarray]) -> list[str]:
        """Problems beyond the schema's (``verify``); messages without the shard path (added by verify)."""
        return []

    def describe(self, index: fmt.Index) -> dict[str, Any]:
        """What ``inspect`` reports for this kind (JSON-able)."""
        return {}

    def describe_lines(self, summary: Mapping[str, Any]) -> list[str]:
        """The human lines of ``inspect`` for :meth:`describe`'s output."""
        return [f"  {k}: {v}" for k, v in summary.items()]

    def warnings(self, index: fmt.Index) -> list[str]:
        """Weak spots of a built dataset, each a sentence with its count (build summary, ``inspect``, and the
        ``warnings`` list of ``inspect --json``). Derived from ``index.stats``, so older indexes work too."""
        return []


KINDS: dict[str, Kind] = {}
BUILTIN = ("pipeline.kinds.perturbation", "pipeline.kinds.spike", "pipeline.kinds.ct")


def register_kind(cls: type[Kind]) -> type[Kind]:
    """Class decorator: make ``cls`` available as ``[dataset] kind = cls.name``."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__name__} has no kind name")
    KINDS[cls.name] = cls()
    return cls


def _load_builtin(modules: tuple[str, ...] = BUILTIN) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise


def get_kind(name: str) -> Kind:
    """The registered kind ``name``. A built-in kind lives in ``pipeline.kinds.<name>``: only that module is
    imported (the others pull in their own libraries, e.g. CT's scipy.ndimage, which a perturbation build or
    a no-change rebuild must not pay for); the rest are imported only when the name is still unknown."""
    if name not in KINDS:
        _load_builtin(tuple(m for m in BUILTIN if m == f"{__package__}.{name}"))
    if name not in KINDS:
        _load_builtin()
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown dataset kind {name!r} (registered: {kind_names()})") from None


def kind_names() -> list[str]:
    _load_builtin()
    return sorted(KINDS)
