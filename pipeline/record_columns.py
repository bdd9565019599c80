"""One shard's record columns, filled record by record from a record kind's ``read_record`` values.

Why a class of its own: the layouts (``loaders.format.LAYOUTS``) decide how a record's value is
stored, and that is the same for every record kind: a dense field is one ``shape`` array per
record, stacked (filled in place into one preallocated array, so a shard's dense bytes are held
once, not once per record plus once stacked); a ragged field is a ``[k, *shape]`` list per
record, stored as offsets + values; a csr field is one sparse row of ``shape[0]`` columns per
record (given as a 1-d dense row, as ``(indices, values)``, or as a 1-row scipy sparse matrix),
stored as indptr (int64) + indices (int32) + data. A value of the wrong shape is an error naming
the record and the field, never a bare numpy broadcast error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loaders import format as fmt
from pipeline.errors import SourceError


class RecordColumns:
    """Accumulates up to ``capacity`` records' values for ``fields``; :meth:`finish` returns the
    columns."""

    def __init__(self, fields: Sequence[fmt.FieldSpec], capacity: int) -> None:
        self.fields = [f for f in fields if f.name != fmt.SAMPLE_ID]
        self.has_ids = any(f.name == fmt.SAMPLE_ID for f in fields)
        self.dense = {
            f.name: np.empty((capacity, *f.shape), f.dtype)
            for f in self.fields
            if f.layout == "dense"
        }
        self.parts: dict[str, list[tuple[np.ndarray, ...]]] = {
            f.name: [] for f in self.fields if f.layout != "dense"
        }
        self.ids: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, sample_id: int, values: Mapping[str, Any], path: str | Path, where: str) -> None:
        """One record's values by field name; a missing or misshapen value is a SourceError naming
        the source file (``path``) and the record (``where``)."""
        row = len(self.ids)
        converted: dict[str, tuple[np.ndarray, ...]] = {}
        for f in (
            self.fields
        ):  # convert everything first: a bad field leaves no half-added record behind
            if f.name not in values:
                raise SourceError(
                    path, f"{where}: read_record returned no value for field {f.name!r}"
                )
            try:
                converted[f.name] = _convert(f, values[f.name])
            except (ValueError, TypeError) as e:
                raise SourceError(
                    path, f"{where}: field {f.name!r} ({f.layout} {f.dtype} {list(f.shape)}): {e}"
                ) from None
        for name, parts in converted.items():
            if name in self.dense:
                self.dense[name][row] = parts[0]
            else:
                self.parts[name].append(parts)
        self.ids.append(int(sample_id))

    def finish(self) -> dict[str, np.ndarray]:
        n = len(self.ids)
        columns: dict[str, np.ndarray] = {}
        if self.has_ids:
            columns[fmt.SAMPLE_ID] = np.asarray(self.ids, np.int64)
        for f in self.fields:
            if f.layout == "dense":
                columns[f.name] = self.dense[f.name][:n]
                continue
            parts = self.parts[f.name]
            ptr = np.zeros(n + 1, np.int64)
            np.cumsum([p[-1].shape[0] for p in parts], out=ptr[1:])
            empty = (
                np.zeros((0, *f.shape), f.dtype) if f.layout == "ragged" else np.zeros(0, f.dtype)
            )
            data = np.concatenate([p[-1] for p in parts]) if parts else empty
            if f.layout == "ragged":
                columns.update(zip(fmt.ragged_keys(f.name), (ptr, data), strict=True))
            else:
                indices = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int32)
                columns.update(zip(fmt.csr_keys(f.name), (ptr, indices, data), strict=True))
        return columns


def _convert(f: fmt.FieldSpec, value: Any) -> tuple[np.ndarray, ...]:
    if f.layout == "dense":
        a = np.asarray(value, dtype=f.dtype)
        if a.shape != f.shape:
            raise ValueError(f"got shape {list(a.shape)}")
        return (a,)
    if f.layout == "ragged":
        a = np.asarray(value, dtype=f.dtype)
        if a.ndim == 0 or a.shape[1:] != f.shape:
            raise ValueError(f"got shape {list(a.shape)}, expected [k, *{list(f.shape)}]")
        return (a,)
    return _csr_row(f, value)


def _csr_row(f: fmt.FieldSpec, value: Any) -> tuple[np.ndarray, np.ndarray]:
    n_cols = f.shape[0]
    if hasattr(value, "tocsr"):  # a scipy sparse row
        m = value.tocsr()
        if m.shape != (1, n_cols):
            raise ValueError(
                f"got a sparse matrix of shape {list(m.shape)}, expected [1, {n_cols}]"
            )
        indices, data = m.indices, m.data
    elif isinstance(value, tuple):
        indices, data = value
    else:
        row = np.asarray(value)
        if row.shape != (n_cols,):
            raise ValueError(
                f"got shape {list(row.shape)}, expected a row of {n_cols} values or (indices, values)"
            )
        indices = np.flatnonzero(row)
        data = row[indices]
    indices = np.asarray(indices)
    if indices.ndim != 1 or np.shape(data) != indices.shape:
        raise ValueError("indices and values must be 1-d and of equal length")
    if indices.size and (indices.min() < 0 or indices.max() >= n_cols):
        raise ValueError(f"column indices outside [0, {n_cols})")
    return indices.astype(np.int32), np.asarray(data, dtype=f.dtype)
