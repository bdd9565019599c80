"""Opening an HDF5 source and naming where its matrix lives: the part of reading a source that
comes before any row is read (errors that tell a missing, foreign and damaged file apart, the
matrix's layout as plain data, its var group). Kept apart from :mod:`h5source`'s row blocks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import SourceError
from pipeline.lazy import LazyModule

if TYPE_CHECKING:
    import h5py
else:  # imported on first use (pipeline.lazy: declaring a source costs no heavy import)
    h5py = LazyModule("h5py")

# What h5py / HDF5 / anndata raise on damaged content after the file opened fine.
READ_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError, IndexError)


def open_h5(path: Path) -> h5py.File:
    """Open read-only, telling missing, foreign and damaged files apart in the error."""
    if not path.exists():
        raise SourceError(path, "file not found")
    if path.is_dir():
        raise SourceError(path, "is a directory, expected an HDF5 file")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        try:
            is_hdf5 = h5py.is_hdf5(path)
        except OSError:
            is_hdf5 = False
        if not is_hdf5:
            raise SourceError(path, f"not an HDF5 file ({exc})") from exc
        raise SourceError(path, f"corrupt or truncated HDF5 file ({exc})") from exc


@dataclass(frozen=True)
class Layout:
    """Where a matrix lives, as plain data so it survives pickling while the h5py handle does not."""

    name: str  # HDF5 path of the group/dataset
    kind: str  # "csr" | "dense" | "field" (a field of a legacy compound obsm dataset)
    shape: tuple[int, int]
    field: str = ""


def var_path_for(matrix_name: str) -> str:
    """raw/X pairs with raw/var, legacy raw.X with raw.var; X and layers share var."""
    if matrix_name.startswith("raw/"):
        return "raw/var"
    if matrix_name.startswith("raw."):
        return "raw.var"
    return "var"
