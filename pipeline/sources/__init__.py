"""Input file types, looked up by the manifest's ``[[sources]] type`` (or inferred from the file suffix
among the types that feed the manifest's kind). Built-in types register on import; plug-ins register with
:func:`register_source` in their own module, listed in the manifest's ``[dataset] plugins``."""

from __future__ import annotations

from pathlib import Path

from pipeline.sources.base import (
    BUILTIN,
    SOURCES,
    Categorical,
    MatrixSource,
    Source,
    SourceMeta,
    get_source,
    infer_type,
    load_builtin,
    register_source,
    source_types_for,
)
from pipeline.sources.h5ad import H5adSource
from pipeline.sources.h5csr import H5CsrSource
from pipeline.sources.validate import CsrParts, validate_block, validate_dense, validate_indptr


def open_source(type_name: str, path: str | Path, matrix: str = "X", *, counts: bool = False) -> MatrixSource:
    """A matrix source without touching the file: opening is lazy so sources can be planned and shipped cheaply."""
    cls = get_source(type_name)
    if not issubclass(cls, MatrixSource):
        raise ValueError(f"source type {type_name!r} is not a matrix source")
    return cls(path, matrix, counts=counts)


__all__ = [
    "BUILTIN",
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
