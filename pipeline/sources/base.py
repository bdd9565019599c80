"""The tiny interface every input kind implements: metadata first, then rows in bounded blocks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import scipy.sparse as sp


@dataclass(frozen=True)
class Categorical:
    """An obs column as integer codes into a list of string categories (-1 = missing value)."""

    codes: np.ndarray  # int32 [n_rows]
    categories: tuple[str, ...]


@dataclass(frozen=True)
class SourceMeta:
    path: Path
    n_rows: int
    n_cols: int
    var_names: tuple[str, ...]
    row_nnz: np.ndarray  # int64 [n_rows]: stored entries per row (n_cols for dense matrices)
    obs: dict[str, Categorical]  # the requested columns that exist
    obsm: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # key -> (shape, dtype)


class Source(ABC):
    """One input file. Opened lazily, read in row blocks; never loads the whole matrix."""

    kind: ClassVar[str]

    def __init__(self, path: str | Path, matrix: str = "X") -> None:
        self.path = Path(path)
        self.matrix = matrix

    @abstractmethod
    def meta(self, obs_columns: Sequence[str], optional: Sequence[str] = ()) -> SourceMeta:
        """Read only metadata. Missing columns in `obs_columns` raise SourceError unless listed in `optional`."""

    @abstractmethod
    def read_rows(self, start: int, stop: int) -> sp.csr_matrix:
        """Rows [start, stop) as float32 CSR with sorted-or-not indices, validated (see validate_block)."""

    @abstractmethod
    def read_obsm(self, key: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of obsm[key] as a dense float32 array."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release file handles (sources may keep an h5py.File open between reads)."""

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
