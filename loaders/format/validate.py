"""The schema check of a shard's logical columns (``loaders.format``): shapes, dtypes, bounds,
pointer arrays and table references, run by the writer before a shard is committed and by every
reader before it serves one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from loaders.format import FormatError
from loaders.format.values import FieldSpec


def validate_columns(
    columns: Mapping[str, np.ndarray],
    fields: Iterable[FieldSpec],
    tables: Iterable[str] = (),
    name: str = "shard",
) -> int:
    """Check shapes, dtypes, bounds, CSR/ragged consistency and table references; return the number
    of records. Tables (``[T, k]`` local row ids) are checked when present in ``columns``."""
    n: int | None = None

    def count(k: str, m: int) -> None:
        nonlocal n
        if n is None:
            n = m
        elif n != m:
            raise FormatError(f"{name}: column {k!r} has {m} records, expected {n}")

    for f in fields:
        for k in f.keys():
            if k not in columns:
                raise FormatError(f"{name}: missing column {k!r}")
        if f.layout == "dense":
            a = columns[f.name]
            if tuple(a.shape[1:]) != f.shape or a.dtype != np.dtype(f.dtype):
                raise FormatError(
                    f"{name}: {f.name!r} is {a.dtype}{list(a.shape)}, schema says {f.dtype}[n,{f.shape}]"
                )
            if f.bound is not None and a.size and (a.min() < 0 or a.max() >= f.bound):
                raise FormatError(f"{name}: {f.name!r} has values outside [0, {f.bound})")
            count(f.name, a.shape[0])
            continue
        ptr_key, payload_key = f.keys()[0], f.keys()[-1]
        ptr = columns[ptr_key]
        if ptr.ndim != 1 or ptr.size == 0 or ptr[0] != 0 or np.any(np.diff(ptr) < 0):
            raise FormatError(f"{name}: {ptr_key!r} is not a monotonic pointer array starting at 0")
        payload = columns[payload_key]
        if int(ptr[-1]) != payload.shape[0] or payload.dtype != np.dtype(f.dtype):
            raise FormatError(
                f"{name}: {payload_key!r} has {payload.shape[0]} {payload.dtype} entries, pointers say {ptr[-1]} {f.dtype}"
            )
        if f.layout == "csr":
            idx = columns[f"{f.name}/indices"]
            if idx.shape != payload.shape or (
                idx.size and (idx.min() < 0 or idx.max() >= f.shape[0])
            ):
                raise FormatError(f"{name}: {f.name}/indices out of range [0, {f.shape[0]})")
        elif tuple(payload.shape[1:]) != f.shape:
            raise FormatError(
                f"{name}: {payload_key!r} inner shape {payload.shape[1:]} != {f.shape}"
            )
        if f.bound is not None and payload.size and (payload.min() < 0 or payload.max() >= f.bound):
            raise FormatError(f"{name}: {payload_key!r} has values outside [0, {f.bound})")
        count(ptr_key, ptr.size - 1)
    n = 0 if n is None else n
    for t in tables:
        if t in columns:
            a = columns[t]
            if a.ndim != 2:
                raise FormatError(
                    f"{name}: table {t!r} is {list(a.shape)}, expected [rows, k] local row ids"
                )
            if a.size and (a.min() < 0 or a.max() >= n):
                raise FormatError(f"{name}: table {t!r} refers to rows outside [0, {n})")
    return n
