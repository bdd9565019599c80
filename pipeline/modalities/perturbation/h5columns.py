"""HDF5 obs and var columns decoded into :class:`Categorical` codes and plain strings, in every
spelling the hand-written (STATE / cell-load) files and anndata's plain encodings use: fixed or
variable-length strings, codes + categories groups, anndata 0.7 category references, numbers.

Why a module of its own: both HDF5 source types decode columns this way, from whichever node their
own layout points at; none of it depends on how the matrix rows are read
(:mod:`pipeline.modalities.perturbation.h5source`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.errors import SourceError
from pipeline.lazy import LazyModule
from pipeline.modalities.perturbation.matrix import Categorical

if TYPE_CHECKING:
    import h5py
    import pandas as pd
else:  # imported on first use (pipeline.lazy: declaring a source costs no heavy import)
    h5py = LazyModule("h5py")
    pd = LazyModule("pandas")


def decode_strings(values: np.ndarray) -> list[str]:
    """Bytes from fixed-length or vlen HDF5 strings, str from anndata readers, numbers from numeric
    datasets."""
    return [
        v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
        for v in np.asarray(values).ravel()
    ]


def categorical_from_codes(
    codes: np.ndarray, categories: np.ndarray, path: str | Path, column: str
) -> Categorical:
    """Stored codes are trusted by nobody downstream: an out-of-range code would silently mislabel
    cells."""
    codes = np.asarray(codes)
    if codes.dtype.kind not in "iu":
        raise SourceError(
            path, f"obs column {column!r}: codes have non-integer dtype {codes.dtype}"
        )
    cats = tuple(decode_strings(np.atleast_1d(categories)))
    if codes.size and (codes.min() < -1 or codes.max() >= len(cats)):
        bad = int(np.argmax((codes < -1) | (codes >= len(cats))))
        raise SourceError(
            path,
            f"obs column {column!r}: row {bad} has code {int(codes[bad])} outside [-1, {len(cats)}) categories",
        )
    return Categorical(codes.astype(np.int32, copy=False), cats)


def to_categorical(values: Any) -> Categorical:
    """Any obs column as codes into categories; non-categorical values get sorted categories,
    missing -> -1."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        cat = pd.Categorical(values)
        return Categorical(
            np.asarray(cat.codes, dtype=np.int32), tuple(decode_strings(cat.categories.to_numpy()))
        )
    arr = values if isinstance(values, pd.api.extensions.ExtensionArray) else np.asarray(values)
    kind = getattr(arr.dtype, "kind", "")  # numbers (nullable ones too), not bool, not strings
    numeric = kind if kind in ("i", "u", "f") else ""
    if isinstance(arr, np.ndarray) and arr.dtype.kind in "SU":
        # fixed-width strings cannot be missing: np.unique sorts and encodes without per-item Python
        # work, and UTF-8 byte order equals code-point order, so decoding after sorting keeps the
        # order
        uniques, inverse = np.unique(arr.ravel(), return_inverse=True)
        return Categorical(inverse.astype(np.int32), tuple(decode_strings(uniques)), numeric)
    # vlen strings arrive as bytes objects: factorize first, decode only the uniques (same order, as
    # above)
    codes, uniques = pd.factorize(arr, sort=True, use_na_sentinel=True)
    return Categorical(
        np.asarray(codes, dtype=np.int32), tuple(decode_strings(np.asarray(uniques))), numeric
    )


def read_plain_column(
    node: h5py.Group | h5py.Dataset, path: str | Path, column: str
) -> Categorical:
    """An obs column as cell-load and hand-rolled writers store it: codes+categories group or a
    plain dataset."""
    if isinstance(node, h5py.Group):
        if "codes" in node and "categories" in node:
            return categorical_from_codes(node["codes"][()], node["categories"][()], path, column)
        raise SourceError(
            path, f"obs column {column!r} is a group without codes/categories (has {sorted(node)})"
        )
    ref = node.attrs.get("categories")
    if isinstance(
        ref, h5py.Reference
    ):  # anndata 0.7: codes dataset pointing at obs/__categories/<col>
        return categorical_from_codes(node[()], node.file[ref][()], path, column)
    return to_categorical(node[()])


def read_plain_strings(node: h5py.Group | h5py.Dataset) -> tuple[str, ...]:
    if isinstance(node, h5py.Group) and "codes" in node and "categories" in node:
        cats = np.asarray(
            [*decode_strings(node["categories"][()]), ""], dtype=object
        )  # code -1 -> ""
        return tuple(cats[node["codes"][()]])
    return tuple(decode_strings(node[()]))
