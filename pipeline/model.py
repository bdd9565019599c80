"""Dataset kinds: what a manifest's ``kind`` selects, and the contract ``build`` works through.

A kind owns its manifest sections (parsed and validated by :meth:`Kind.parse`, errors naming the
key), its record schema (``FieldSpec`` s and shard tables, with ``bound`` s for codes), the
sample types its shards serve (their units are counted at pack time with ``loaders.samples``),
its scan and planner (which records go to which shard and split, side tables), how its shards are
packed, what it adds to ``index.json``, its extra ``verify`` checks and what ``inspect`` says.
``build``, ``verify``, ``incremental`` and ``inspect`` only call these methods and read the typed
:class:`KindPlan`; they never name a kind's columns.

Registry in the style of numcodecs: :func:`register_kind` / :func:`get_kind`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from loaders import format as fmt
from loaders.plugins import load_build_modalities, load_plugin
from loaders.plugins.registry import Registry
from pipeline.fingerprint import Fingerprint
from pipeline.source import SOURCES
from pipeline.writers.base import Codec

Task = Callable[[], Any]


@dataclass(frozen=True)
class SourceSpec:
    path: Path
    type: str
    matrix: str = "X"  # for matrix sources: which matrix in the file
    options: tuple[tuple[str, Any], ...] = ()  # other [[sources]] keys the source type accepts

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)


@dataclass(frozen=True)
class Manifest:
    path: Path
    name: str
    kind: str
    format: str
    seed: int
    shard_size_mb: float
    codec: str
    codec_level: int
    block_rows: int
    sources: tuple[SourceSpec, ...]
    config: Any  # the kind's parsed sections (Kind.parse)
    plugins: tuple[str, ...] = ()
    sha256: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class ShardPlan:
    """One shard to write: its split, its source (-1 if mixed), its number within (source, split),
    the rows or records it holds in shard order, and the columns the planner already made (a
    column may be parked in a ``.npy`` file between planning and packing)."""

    split: str
    source: int
    part: int
    rows: (
        np.ndarray
    )  # source rows (perturbation: int32 below 2**31) or record numbers (int64), in shard order
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
    """What one pack task reports for one shard: its entry, records it skipped (reason -> count),
    the kind's per-record metadata (JSON-able, stored under ``sections[kind]["records"][file]``)
    and counts of values it changed to keep them exact (name -> count, summed into the index
    stats under that name)."""

    number: int
    entry: fmt.ShardEntry
    skipped: dict[str, int] = field(default_factory=dict)
    records: list[Any] | None = None
    counts: dict[str, int] = field(
        default_factory=dict
    )  # values made exact, e.g. duplicate entries summed


@dataclass
class KindPlan:
    """The planner's typed output: everything ``build`` needs to pack and commit."""

    shards: list[ShardPlan]
    fields: tuple[fmt.FieldSpec, ...]
    tables: tuple[str, ...]
    conditions: dict[str, np.ndarray] | None = (
        None  # the condition table's columns, if the kind has one
    )
    condition_segments: list[Any] = field(
        default_factory=list
    )  # which field fills which vector columns
    vocabularies: dict[str, list[str]] = field(default_factory=dict)
    obs_fields: list[str] = field(default_factory=list)
    control_labels: list[str] = field(default_factory=list)
    section: dict[str, Any] = field(
        default_factory=dict
    )  # sections[kind] of the index (settings, not data)
    stats: dict[str, Any] = field(default_factory=dict)
    primary_records: int | None = None  # None: the sum of the shards' records once packed
    source_keys: list[str] = field(
        default_factory=list
    )  # per source: what its shards depend on (incremental)
    source_stats: list[dict[str, int]] = field(default_factory=list)
    extra: Any = None  # the kind's own planning state, handed back to its pack_tasks


@dataclass
class PlanStream:
    """A plan made one source at a time (:meth:`Kind.plan_stream`): ``plan`` holds the dataset-wide
    part from the start and gains each source's shards as ``sources`` advances; each step plans one
    source and yields the indices of its shards in ``plan.shards``. Exhausted, the plan is whole
    (stats and per-source keys included) and equal to :meth:`Kind.plan`'s."""

    plan: KindPlan
    sources: Iterator[range]


@dataclass
class PlanContext:
    """What the build hands the planner: where big tables may be parked, which shards can be reused,
    what an earlier build planned per source (``known``), and the code digest (``salt``)."""

    park: Callable[[ShardPlan], None] | None = None
    known: Mapping[str, tuple[list[ShardPlan], dict[str, int]]] | None = None
    salt: str = ""
    previous: fmt.Index | None = None


class Kind(ABC):
    """One kind of dataset. Subclasses set :attr:`name`, :attr:`sections` and :attr:`samples`."""

    name: ClassVar[str]
    # manifest tables this kind owns, each declared once as a dataclass of pipeline.schema keys: the
    # manifest checks them (pipeline.schema.read) before parse, and `shardsmith schema` prints them
    section_types: ClassVar[Mapping[str, type]] = {}
    sections: ClassVar[tuple[str, ...]] = ()  # default: the names of section_types
    samples: ClassVar[tuple[str, ...]] = ()  # sample types its shards serve
    parked: ClassVar[
        tuple[str, ...]
    ] = ()  # planned columns parked in spill files until their shard is packed
    resumable: ClassVar[bool] = (
        False  # a pack result is the index entry alone: finished shards can be adopted
    )

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.section_types and "sections" not in cls.__dict__:
            cls.sections = tuple(cls.section_types)

    @abstractmethod
    def parse(self, path: Path, sections: Mapping[str, Any]) -> Any:
        """The kind's typed config from its manifest tables: a table declared in ``section_types``
        arrives checked, as a dict of every key (defaults filled in); any other is the raw table
        (None when absent). Raise ManifestError for settings that contradict each other."""

    def source_defaults(self, config: Any) -> dict[str, Any]:
        """Defaults for ``[[sources]]`` keys (e.g. the matrix for matrix sources)."""
        return {}

    def pack_options(self, manifest: Manifest) -> Any:
        """The kind's own pack settings (``PackConfig.options``), read when the build starts;
        JSON-able or a frozen dataclass (remote backends ship it to their workers)."""
        return None

    def input_files(self, manifest: Manifest) -> list[Path]:
        """Files besides the sources whose content the shards depend on (part of the no-change
        check)."""
        return []

    def source_companions(self, manifest: Manifest, spec: SourceSpec) -> list[Path]:
        """Files besides ``spec.path`` that its records' bytes or metadata are read from, present
        or not (adding one is a change): part of the source's fingerprint
        (:mod:`pipeline.fingerprint`). The default asks the source type
        (:meth:`pipeline.source.Source.companions`); a kind whose companions depend on its
        settings (spike's paired images) adds them."""
        cls = SOURCES.get(spec.type, None)
        return list(cls.companions(spec.path)) if cls is not None else []

    @abstractmethod
    def scan(
        self,
        manifest: Manifest,
        cache: Mapping[str, Mapping[str, object]] | None,
        hasher: Executor | None,
    ) -> list[ScannedSource]:
        """Fingerprint the sources and read their metadata; fail early naming the file."""

    @abstractmethod
    def plan(
        self, manifest: Manifest, scanned: Sequence[ScannedSource], ctx: PlanContext
    ) -> KindPlan:
        """The plan: a pure function of (manifest, seed, scanned sources)."""

    def plan_stream(
        self, manifest: Manifest, scanned: Sequence[ScannedSource], ctx: PlanContext
    ) -> PlanStream | None:
        """The plan one source at a time, for a build that packs each source while planning the
        next (``pipeline.pipelined``); None (the default): this kind plans only whole."""
        return None

    @abstractmethod
    def pack_tasks(
        self,
        manifest: Manifest,
        plan: KindPlan,
        scanned: Sequence[ScannedSource],
        todo: Sequence[int],
        cfg: PackConfig,
    ) -> tuple[list[Task], list[Task]]:
        """Tasks of two phases, each returning a list of :class:`PackResult` (phase 1 may return
        [])."""

    def check_shard(self, index: fmt.Index, columns: Mapping[str, np.ndarray]) -> list[str]:
        """Problems beyond the schema's (``verify``); messages without the shard path (added by
        verify)."""
        return []

    def describe(self, index: fmt.Index) -> dict[str, Any]:
        """What ``inspect`` reports for this kind (JSON-able)."""
        return {}

    def describe_lines(self, summary: Mapping[str, Any]) -> list[str]:
        """The human lines of ``inspect`` for :meth:`describe`'s output."""
        return [f"  {k}: {v}" for k, v in summary.items()]

    def warnings(self, index: fmt.Index) -> list[str]:
        """Weak spots of a built dataset, each a sentence with its count (build summary,
        ``inspect``, and the ``warnings`` list of ``inspect --json``). Derived from
        ``index.stats``, so older indexes work too."""
        return []


KINDS: Registry[Kind] = Registry("dataset kind", discover=load_build_modalities)


def register_kind(cls: type[Kind]) -> type[Kind]:
    """Class decorator: make ``cls`` available as ``[dataset] kind = cls.name``."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__name__} has no kind name")
    KINDS.register(cls.name, cls())
    return cls


def get_kind(name: str) -> Kind:
    """The registered kind ``name``. A modality registers its kind lazily (its module is imported on
    the first lookup), so a perturbation build never pays for CT's scipy.ndimage."""
    return KINDS.get(name)


def kind_names() -> list[str]:
    return KINDS.names()


def open_index(root: str | Path) -> fmt.Index:
    """A committed dataset's index with the plug-ins it names imported on both sides (with their
    ``BUILD_MODULE``): `verify`, `inspect`, `export` and `gc` need a plug-in's kind as a reader
    needs its sample type, in a fresh process too. A missing one is a ``PluginError``."""

    index = fmt.read_index(root)  # imports each plug-in's read side
    for module in index.plugins:
        load_plugin(module, build=True, needed_by=f"the dataset {index.root}")
    return index


@dataclass(frozen=True)
class ScannedSource:
    """A source after the scan. ``meta``/``obs``: what its kind's scan read (matrix metadata and obs
    columns for perturbation; the kind's own record list otherwise)."""

    ordinal: int  # position in the manifest's resolved source list
    spec: SourceSpec
    pending: (
        Fingerprint | Future[Fingerprint]
    )  # a Future while the content hash is computed in the background
    meta: Any  # the kind's scan output for this source (a matrix kind: its SourceMeta)
    obs: dict[str, Any]  # a matrix kind: logical field name -> Categorical
    has_obs_names: bool = (
        False  # the source has cell barcodes: the plan reads them per source (see compact_meta)
    )

    @property
    def fingerprint(self) -> Fingerprint:
        """The fingerprint, waiting for the background hash if there is one (only plan keys need
        it)."""
        return self.pending.result() if isinstance(self.pending, Future) else self.pending


@dataclass(frozen=True)
class PackConfig:
    """What every pack task needs to write shards, whatever the kind (the write side of the
    contract)."""

    out: Path
    spill: Path
    encoding: str
    codec: Codec
    fields: tuple[fmt.FieldSpec, ...]
    block_rows: int
    tables: tuple[str, ...] = ()  # the schema's shard tables
    samples: tuple[str, ...] = ()  # sample types whose units each shard entry counts
    # local backends: a task deletes the spill files it has consumed. Files deleted before the
    # kernel writes them back never reach the disk: a 2M-cell build's ~4 GB of spill and parked
    # columns crossed the dirty page limits, and writeback and write throttling made spill I/O grow
    # ~2.5x for 2x the cells. A cluster backend reruns a lost worker's tasks, which need their
    # files: the build's end removes them there.
    drop_spill: bool = False
    # the build's parallelism: with 2 sources a job or more, a source is one task (pack_tasks)
    jobs: int = 1
    # every source is one task whatever their number: a pipelined build hands the kind its
    # sources one at a time (pipeline.pipelined)
    whole_sources: bool = False
    options: Any = None  # the kind's own pack settings (Kind.pack_options), typed by the kind
