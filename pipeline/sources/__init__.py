"""Input file types, looked up by the manifest's ``[[sources]] type`` (or inferred from the file suffix
among the types that feed the manifest's kind). Built-in types register on import; plug-ins register with
:func:`register_source` in their own module, listed in the manifest's ``[dataset] plugins``."""

from __future__ import annotations

import importlib
from pathlib import Path

from pipeline.sources.base import (
    SOURCES,
    Categorical,
    MatrixSource,
    Source,
    SourceMeta,
    get_source,
    infer_type,
    register_source,
    source_types_for,
)
from pipeline.sources.h5ad import H5adSource
from pipeline.sources.h5csr import H5CsrSource
from pipeline.sources.validate import CsrParts, validate_block, validate_dense, validate_indptr

BUILTIN = ("pipeline.sources.dat", "pipeline.sources.npy")  # h5ad, h5csr: imported above


def load_builtin() -> None:
    """Import the built-in source modules (each registers itself); a missing optional one is skipped."""
    for name in BUILTIN:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise


def open_source(type_name: str, path: str | Path, matrix: str = "X", *, counts: bool = False) -> MatrixSource:
    """A matrix source without touching the file: opening is lazy so sources can be planned and shipped cheaply."""
    load_builtin()
    cls = get_source(type_name)
    if not issubclass(cls, MatrixSource):
        raise ValueError(f"source type {type_name!r} is not a matrix source")
    return cls(path, matrix, counts=counts)


__all__ = [
    "SOURCES",
    "Categorical",
    "CsrParts",
    "H5CsrSource",
    "H5adSource",
    "MatrixSource",
    "Source",
    "SourceMeta",
    "get_source",
    "infer_type",
    "load_builtin",
    "open_source",
    "register_source",
    "source_types_for",
    "validate_block",
    "validate_dense",
    "validate_indptr",
]
