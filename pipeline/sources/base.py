"""The tiny interface every input kind implements: metadata first, then rows in bounded blocks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse as sp

    from pipeline.sources.obs_names import ObsNames


@dataclass(frozen=True)
class Categorical:
    """An obs column as integer codes into a list of string categories (-1 = missing value)."""

    codes: np.ndarray  # int32 [n_rows] (the scan keeps them as the smallest type: see compact)
    categories: tuple[str, ...]

    def compact(self) -> Categorical:
        """The same column with codes in the smallest signed type its categories allow (1 byte a cell for
        up to 127 categories instead of 4): the scan holds every cell's codes until the plan is made."""
        return Categorical(self.codes.astype(code_dtype(len(self.categories)), copy=False), self.categories)


def code_dtype(n: int) -> np.dtype:
    """The smallest signed integer type holding codes -1 .. n - 1."""
    return np.dtype(next(t for t in (np.int8, np.int16, np.int32, np.int64) if n <= np.iinfo(t).max))


@dataclass(frozen=True)
class SourceMeta:
    path: Path
    n_rows: int
    n_cols: int
    var_names: tuple[str, ...]
    row_nnz: np.ndarray  # int64 [n_rows]: stored entries per row (n_cols for dense matrices)
    obs: dict[str, Categorical]  # the requested columns that exist
    obsm: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # key -> (shape, dtype)
    named_genes: bool = True  # False: the file has no var names and `var_names` were made up (gene_0, ...)
    obs_names: ObsNames | None = None  # the cell barcodes (obs index), when the source has rows of cells
    has_obs_names: bool = False  # meta(names=False): the source has barcodes, checked but not read


class Source(ABC):
    """One input file of a registered *source type*. Opened lazily; never loads more than a bounded block.

    A source class declares what the registry needs to pick it without copied lists: its ``type`` (the
    manifest's ``[[sources]] type``), the dataset ``kinds`` it feeds, the file ``suffixes`` it claims (a
    manifest that names no type gets the one source type of its kind claiming the file's suffix), the extra
    ``[[sources]]`` keys it accepts (``options``) and the record fields it produces (``produces``, for docs and
    error messages). How records are read is the business of the interface its kinds use
    (:class:`MatrixSource` for perturbation; a record kind defines its own).
    """

    type: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]] = ()
    suffixes: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[tuple[str, ...]] = ()
    produces: ClassVar[tuple[str, ...]] = ()

    def __init__(self, path: str | Path, **options: object) -> None:
        self.path = Path(path)

    @classmethod
    def expand(cls, path: Path) -> list[Path]:
        """The input files a manifest path match stands for (a folder may stand for the files in it)."""
        return [path]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release file handles (sources may keep a file open between reads)."""

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MatrixSource(Source):
    """A cell x gene matrix with obs annotations (h5ad, H5-CSR): metadata first, then rows in blocks."""

    fillable_obs: ClassVar[tuple[str, ...]] = ()  # logical obs fields the source can supply itself

    def __init__(self, path: str | Path, matrix: str = "X", **options: object) -> None:
        super().__init__(path)
        self.matrix = matrix

    @abstractmethod
    def meta(self, obs_columns: Sequence[str], optional: Sequence[str] = (), names: bool = True) -> SourceMeta:
        """Read only metadata. Missing columns in `obs_columns` raise SourceError unless listed in `optional`.
        `names=False`: the cell barcodes are checked but not read (`SourceMeta.has_obs_names`): the scan keeps
        none, and reading them twice was ~0.1 s a source of 250k cells on the build's serial path."""

    def fill_obs(self, logical: str, n_rows: int) -> Categorical | None:
        """A value for a logical obs field the file lacks (one of ``fillable_obs``), else None."""
        return None

    def obs_columns(self) -> list[str]:
        """The file's obs column names (for errors that list what the manifest could name instead)."""
        return []

    def read_obs_names(self, n_rows: int) -> ObsNames | None:
        """The cell barcodes alone, read again when the plan needs them: the scan does not keep every
        source's names (~20 bytes a cell). A source type reads them more cheaply than its whole `meta`."""
        return self.meta([]).obs_names

    @abstractmethod
    def read_rows(self, start: int, stop: int) -> sp.csr_matrix:
        """Rows [start, stop) as float32 CSR with sorted-or-not indices, validated (see validate_block)."""

    @abstractmethod
    def read_obsm(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of obsm[key] as a dense float32 array."""


SOURCES: dict[str, type[Source]] = {}
# Built-in source modules: the one for type ``t`` is ``pipeline.sources.<t>``. They register on import;
# ``get_source`` imports only the module of the type asked for (a CT source pulls in scipy.ndimage, which a
# perturbation build must not pay for), listing every type of a kind imports them all.
BUILTIN = ("pipeline.sources.h5ad", "pipeline.sources.h5csr", "pipeline.sources.dat", "pipeline.sources.npy")


def register_source(cls: type[Source]) -> type[Source]:
    """Class decorator: make ``cls`` available as ``[[sources]] type = cls.type``."""
    if not getattr(cls, "type", None):
        raise TypeError(f"{cls.__name__} has no source type")
    SOURCES[cls.type] = cls
    return cls


def load_builtin(modules: Sequence[str] = BUILTIN) -> None:
    """Import built-in source modules (each registers itself); a missing optional one is skipped."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise


def get_source(type_name: str) -> type[Source]:
    if type_name not in SOURCES:
        load_builtin([m for m in BUILTIN if m == f"{__package__}.{type_name}"])
    try:
        return SOURCES[type_name]
    except KeyError:
        load_builtin()
        raise ValueError(f"unknown source type {type_name!r} (registered: {', '.join(sorted(SOURCES))})") from None


def source_types_for(kind: str) -> list[str]:
    """The registered source types that feed dataset kind ``kind``."""
    load_builtin()
    return sorted(t for t, cls in SOURCES.items() if kind in cls.kinds)


def infer_type(path: str, kind: str) -> str | None:
    """The one source type of ``kind`` claiming ``path``'s suffix, or None (none or several claim it)."""
    hits = [t for t in source_types_for(kind) if str(path).lower().endswith(SOURCES[t].suffixes)]
    return hits[0] if len(hits) == 1 else None
