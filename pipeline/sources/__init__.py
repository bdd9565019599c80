"""Input kinds the pipeline can shard, looked up by the `kind` a manifest names."""

from __future__ import annotations

from pathlib import Path

from pipeline.sources.base import Categorical, Source, SourceMeta
from pipeline.sources.h5ad import H5adSource
from pipeline.sources.h5csr import H5CsrSource
from pipeline.sources.validate import CsrParts, validate_block, validate_dense, validate_indptr

SOURCES: dict[str, type[Source]] = {"h5ad": H5adSource, "h5csr": H5CsrSource}


def open_source(kind: str, path: str | Path, matrix: str = "X", *, counts: bool = False) -> Source:
    """Build a source without touching the file: opening is lazy so sources can be planned and shipped cheaply."""
    try:
        cls = SOURCES[kind]
    except KeyError:
        raise ValueError(f"unknown source kind {kind!r} (known: {', '.join(sorted(SOURCES))})") from None
    return cls(path, matrix, counts=counts)  # type: ignore[call-arg]  # every registered source takes counts


__all__ = [
    "SOURCES",
    "Categorical",
    "CsrParts",
    "H5CsrSource",
    "H5adSource",
    "Source",
    "SourceMeta",
    "open_source",
    "validate_block",
    "validate_dense",
    "validate_indptr",
]
