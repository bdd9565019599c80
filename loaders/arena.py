"""Window arenas: one decoded window as a CSR matrix over recycled buffers (no torch: the decoder process
imports this).

An *arena* is one decoded window, its shards' columns back to back: ``X/indices`` (int32) and ``X/data``
are decoded straight into ``cols``/``vals`` (:meth:`loaders.shardio.Column.read_into`), each shard right
after the previous one, so with the rebased row pointers the window's X *is* a CSR matrix. It is wrapped
as a ``scipy.sparse.csr_matrix`` (no copy), and a batch is ``x[rows]`` followed by ``toarray``: scipy's
C++ row gather and densify, the very operation the in-memory baseline runs, with no Python loop over
samples and no window-sized copy (an earlier design permuted each window once into the epoch's order:
it cost a full extra read+write of the window per epoch and more CPU than it saved per batch).
The big arrays are recycled by a :class:`BufferPool` (fresh memory: a page fault per 4 KiB), or live in
a shared slab filled by the decoder process (:mod:`loaders.decoder`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import scipy.sparse as sp

from loaders.format import PAIRS, PRIMARY, SENTENCES_CTRL, SENTENCES_PERT, X

INDPTR, INDICES, DATA = f"{X}/indptr", f"{X}/indices", f"{X}/data"
ALIGN = 64


class BufferPool:
    """Big 64-byte-aligned arrays recycled between windows (and epochs) of one process.

    The owners are uint64 arrays: numpy points every view's ``base`` at the owner, and scipy copies a
    CSR component whose base has more than twice its number of *elements* (``_prune_array``), which
    a float32 view of a uint8 owner always has."""

    def __init__(self, keep: int = 6) -> None:
        self.keep, self.pid = keep, os.getpid()
        self._free: list[np.ndarray] = []  # raw uint64 owners
        self._lock = threading.Lock()

    def get(self, n: int, dtype: np.dtype) -> np.ndarray:
        size = n * np.dtype(dtype).itemsize
        need = size + ALIGN
        with self._lock:
            fits = [b for b in self._free if need <= b.nbytes <= 2 * need]
            raw = min(fits, key=lambda b: b.nbytes) if fits else None
            if raw is not None:
                self._free = [b for b in self._free if b is not raw]
        if raw is None:  # headroom: the next window is a little bigger or smaller
            raw = np.empty(-(-(need + need // 32) // 8), np.uint64)
        raw8 = raw.view(np.uint8)
        skip = -raw8.ctypes.data % ALIGN
        return raw8[skip:skip + size].view(dtype)

    def clear(self) -> None:
        """Let go of every recycled buffer (e.g. once a decoder process serves the windows instead)."""
        with self._lock:
            self._free.clear()

    def put(self, *arrays: np.ndarray) -> None:
        with self._lock:
            for a in arrays:
                raw = a
                while isinstance(raw.base, np.ndarray):
                    raw = raw.base
                if raw.dtype == np.uint64 and raw.ndim == 1 and all(raw is not b for b in self._free):
                    self._free.append(raw)
            del self._free[:-self.keep]


class Buffers(Protocol):
    """Where an arena's arrays go: a :class:`BufferPool`, or a decoder slab (``loaders.decoder``)."""

    def get(self, n: int, dtype: np.dtype) -> np.ndarray: ...

    def clear(self) -> None:
        """Let go of every recycled buffer (e.g. once a decoder process serves the windows instead)."""
        with self._lock:
            self._free.clear()

    def put(self, *arrays: np.ndarray) -> None: ...


@dataclass
class Arena:
    """One decoded window: its shards' rows side by side, plus the rows each unit refers to."""

    shards: np.ndarray  # int64 [k]: shard ids, in concatenation order
    row_offsets: np.ndarray  # int64 [k+1]: rows of shard i are [row_offsets[i], row_offsets[i+1])
    nnz_offsets: np.ndarray  # int64 [k+1]: entries of shard i are [nnz_offsets[i], nnz_offsets[i+1])
    indptr: np.ndarray  # int64 [R+1]: the window's CSR row pointers
    cols: np.ndarray  # int32 [>= nnz]: X/indices of every shard, back to back (a pooled buffer)
    vals: np.ndarray  # [>= nnz]: X/data likewise
    ints: np.ndarray  # int64 [len(int_keys), R]
    n_cols: int
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # other per-row columns (sample_id, obsm/*)
    unit_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))  # int64 [k+1]
    units: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.int64))  # int64 [U, width] arena rows
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # unit (row of units) per position
    x: Any = None  # scipy.sparse.csr_matrix over indptr/cols/vals, once every shard is in (:meth:`seal`)
    on_release: Callable[[], None] | None = None  # set when the buffers are not the pool's (a decoder slab)

    @staticmethod
    def allocate(shards: Sequence[int], rows: Sequence[int], nnz: Sequence[int], int_keys: Sequence[str],
                 other: Mapping[str, tuple[np.dtype, tuple[int, ...]]], data_dtype: np.dtype, n_cols: int,
                 pool: Buffers) -> Arena:
        """Empty buffers for shards with ``rows[i]`` rows and ``nnz[i]`` X entries."""
        row_off = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(rows, out=row_off[1:])
        nnz_off = np.zeros(len(nnz) + 1, np.int64)
        np.cumsum(nnz, out=nnz_off[1:])
        n, cap = int(row_off[-1]), max(1, int(nnz_off[-1]))
        columns = {k: pool.get(n * int(np.prod(inner, dtype=np.int64)), dt).reshape(n, *inner)
                   for k, (dt, inner) in other.items()}
        indptr = pool.get(n + 1, np.dtype(np.int64))
        indptr[0] = 0
        ints = pool.get(len(int_keys) * n, np.dtype(np.int64)).reshape(len(int_keys), n)
        return Arena(np.asarray(shards, np.int64), row_off, nnz_off, indptr, pool.get(cap, np.dtype(np.int32)),
                     pool.get(cap, data_dtype), ints, int(n_cols), columns)

    def set_rows(self, i: int, indptr: np.ndarray) -> None:
        """Row pointers of shard ``i`` (its own, validated ``X/indptr``), rebased to where its entries went."""
        r0, r1 = int(self.row_offsets[i]), int(self.row_offsets[i + 1])
        np.add(indptr[1:], self.nnz_offsets[i], out=self.indptr[r0 + 1:r1 + 1])

    def seal(self) -> None:
        """Wrap the decoded X as a CSR matrix (views of the buffers, no copy)."""
        nnz = int(self.nnz_offsets[-1])
        self.x = sp.csr_matrix((self.vals[:nnz], self.cols[:nnz], self.indptr),
                               shape=(self.indptr.size - 1, self.n_cols), copy=False)

    def set_units(self, per_shard: Sequence[np.ndarray], width: int) -> None:
        """Units of every shard (local rows ``[U_i, width]``), made arena rows."""
        parts = [u + self.row_offsets[i] for i, u in enumerate(per_shard)]
        self.units = np.concatenate(parts).reshape(-1, width) if parts else np.zeros((0, width), np.int64)
        self.unit_offsets = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([u.shape[0] for u in parts], out=self.unit_offsets[1:])

    def set_order(self, shard_idx: np.ndarray, local_idx: np.ndarray) -> None:
        """Positions of the window (``order.window_units``) as rows of ``units``."""
        srt = np.argsort(self.shards)
        slot = srt[np.searchsorted(self.shards, shard_idx, sorter=srt)]
        self.order = self.unit_offsets[slot] + local_idx

    def release(self, pool: BufferPool) -> None:
        """Hand the big buffers back (the arena must not be used afterwards)."""
        self.x = None
        if self.on_release is not None:
            self.on_release()
        else:
            pool.put(self.cols, self.vals)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.units, self.indptr, self.cols, self.vals, self.ints, self.order,
                                          *self.columns.values())))


def shard_units(columns: Mapping[str, np.ndarray], sample: str) -> np.ndarray:
    """Local rows of a shard's units, ``[U, width]``."""
    if sample == "cells":
        return np.flatnonzero(columns[PRIMARY]).astype(np.int64)[:, None]
    if sample == "pairs":
        return columns[PAIRS].astype(np.int64).reshape(-1, 2)
    return np.concatenate([columns[SENTENCES_PERT], columns[SENTENCES_CTRL]], axis=1).astype(np.int64)
