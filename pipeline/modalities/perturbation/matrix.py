"""Matrix sources (h5ad, H5-CSR): a cell x gene matrix with obs annotations, read as metadata first,
then rows in bounded blocks. The interface the perturbation kind reads its sources through."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipeline.buffers import Scratch
from pipeline.errors import SourceError
from pipeline.modalities.perturbation.obs_names import ObsNames
from pipeline.source import Source, get_source

if TYPE_CHECKING:
    import scipy.sparse as sp


@dataclass(frozen=True)
class Categorical:
    """An obs column as integer codes into a list of string categories (-1 = missing value)."""

    codes: np.ndarray  # int32 [n_rows] (the scan keeps them as the smallest type: see compact)
    categories: tuple[str, ...]
    # the dtype kind ("i", "u", "f") when the source stores the column as numbers rather than as a
    # categorical or strings; "" otherwise. The scan refuses such a column as a one-hot covariate
    # when it looks like a measurement (pipeline.modalities.perturbation.scan.check_covariates)
    numeric: str = ""

    def compact(self) -> Categorical:
        """The same column with codes in the smallest signed type its categories allow (1 byte a
        cell for up to 127 categories instead of 4): the scan holds every cell's codes until the
        plan is made."""
        return Categorical(
            self.codes.astype(code_dtype(len(self.categories)), copy=False),
            self.categories,
            self.numeric,
        )


def code_dtype(n: int) -> np.dtype:
    """The smallest signed integer type holding codes -1 .. n - 1."""
    return np.dtype(
        next(t for t in (np.int8, np.int16, np.int32, np.int64) if n <= np.iinfo(t).max)
    )


@dataclass(frozen=True)
class SourceMeta:
    path: Path
    n_rows: int
    n_cols: int
    var_names: tuple[str, ...]
    row_nnz: np.ndarray  # int64 [n_rows]: stored entries per row (n_cols for dense matrices)
    obs: dict[str, Categorical]  # the requested columns that exist
    obsm: dict[str, tuple[tuple[int, ...], str]] = field(
        default_factory=dict
    )  # key -> (shape, dtype)
    named_genes: bool = (
        True  # False: the file has no var names and `var_names` were made up (gene_0, ...)
    )
    obs_names: ObsNames | None = (
        None  # the cell barcodes (obs index), when the source has rows of cells
    )
    has_obs_names: bool = False  # meta(names=False): the source has barcodes, checked but not read


class MatrixSource(Source):
    """A cell x gene matrix with obs annotations (h5ad, H5-CSR): metadata first, then rows in
    blocks."""

    fillable_obs: ClassVar[tuple[str, ...]] = ()  # logical obs fields the source can supply itself

    def __init__(self, path: str | Path, matrix: str = "X", **options: object) -> None:
        super().__init__(path)
        self.matrix = matrix
        # Buffers `read_rows` may read a block's entries into (a source type that can), reused
        # by the next read: set by a reader done with each block before it reads the next (the
        # pack), which then faults in no fresh pages per block (pipeline.buffers).
        self.buffers: Scratch | None = None

    @abstractmethod
    def meta(
        self, obs_columns: Sequence[str], optional: Sequence[str] = (), names: bool = True
    ) -> SourceMeta:
        """Read only metadata. Missing columns in `obs_columns` raise SourceError unless listed in
        `optional`. `names=False`: the cell barcodes are checked but not read
        (`SourceMeta.has_obs_names`): the scan keeps none, and reading them twice was ~0.1 s a
        source of 250k cells on the build's serial path."""

    def fill_obs(self, logical: str, n_rows: int) -> Categorical | None:
        """A value for a logical obs field the file lacks (one of ``fillable_obs``), else None."""
        return None

    def obs_columns(self) -> list[str]:
        """The file's obs column names (for errors that list what the manifest could name instead)."""
        return []

    def read_obs_names(self, n_rows: int) -> ObsNames | None:
        """The cell barcodes alone, read again when the plan needs them: the scan does not keep
        every source's names (~20 bytes a cell). A source type reads them more cheaply than its
        whole `meta`."""
        return self.meta([]).obs_names

    @abstractmethod
    def read_rows(self, start: int, stop: int) -> sp.csr_matrix:
        """Rows [start, stop) as float32 CSR with sorted-or-not indices, validated (see
        validate_block)."""

    @abstractmethod
    def read_obsm(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of obsm[key] as a dense float32 array."""


def open_source(
    type_name: str, path: str | Path, matrix: str = "X", *, counts: bool = False
) -> MatrixSource:
    """A matrix source without touching the file: opening is lazy so sources can be planned and
    shipped cheaply."""
    cls = get_source(type_name)
    if not issubclass(cls, MatrixSource):
        raise ValueError(f"source type {type_name!r} is not a matrix source")
    return cls(path, matrix, counts=counts)


def source_obs_names(src: Any) -> ObsNames | None:
    """The cell barcodes of the scanned source ``src`` (None when its source type reads none), read
    from its file once per source by the plan: the scan checks them but keeps none (20+ bytes a
    cell of the dataset)."""
    if not getattr(src, "has_obs_names", False):
        return None
    with open_source(src.spec.type, src.spec.path, src.spec.matrix) as f:
        names = f.read_obs_names(src.meta.n_rows)
    if names is not None and len(names) != src.meta.n_rows:
        raise SourceError(
            src.spec.path,
            f"obs index has {len(names)} names, the matrix has {src.meta.n_rows} rows",
        )
    return names
