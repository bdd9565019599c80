"""Window arenas, row gathers, densify, and batch transport.

An *arena* is one decoded window, its shards' columns back to back: ``X/indices`` (int32) and ``X/data``
are decoded straight into ``cols``/``vals`` (:meth:`loaders.shardio.Column.read_into`), each shard right
after the previous one, so with the rebased row pointers the window's X *is* a CSR matrix. It is wrapped
as a ``scipy.sparse.csr_matrix`` (no copy), and a batch is ``x[rows]`` followed by ``toarray``: scipy's
C++ row gather and densify, the very operation the in-memory baseline runs, with no Python loop over
samples and no window-sized copy (an earlier design permuted each window once into the epoch's order:
it cost a full extra read+write of the window per epoch and more CPU than it saved per batch).
The big arrays are recycled by a :class:`BufferPool` (fresh memory: a page fault per 4 KiB).

Transport: in the main process batches are zero-copy tensors (:func:`to_tensors`). A DataLoader worker
ships ONE shared-memory buffer per batch (:func:`to_shared`, X densified straight into it): torch
otherwise creates a shared-memory segment per tensor (~1 ms each here). The consumer splits it back
into views (:func:`loaders.device.unpack_batch`), on the GPU after a single host-to-device copy.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from loaders.format import PAIRS, PRIMARY, SENTENCES_CTRL, SENTENCES_PERT, X

INDPTR, INDICES, DATA = f"{X}/indptr", f"{X}/indices", f"{X}/data"
PACKED, LAYOUT = "__packed__", "__layout__"  # keys of a batch in shared-buffer transport
PARTS = (".crow", ".cols", ".vals")  # a CSR X shipped in parts: key + suffix
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

    def put(self, *arrays: np.ndarray) -> None:
        with self._lock:
            for a in arrays:
                raw = a
                while isinstance(raw.base, np.ndarray):
                    raw = raw.base
                if raw.dtype == np.uint64 and raw.ndim == 1 and all(raw is not b for b in self._free):
                    self._free.append(raw)
            del self._free[:-self.keep]


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

    @staticmethod
    def allocate(shards: Sequence[int], rows: Sequence[int], nnz: Sequence[int], int_keys: Sequence[str],
                 other: Mapping[str, tuple[np.dtype, tuple[int, ...]]], data_dtype: np.dtype, n_cols: int,
                 pool: BufferPool) -> Arena:
        """Empty buffers for shards with ``rows[i]`` rows and ``nnz[i]`` X entries."""
        row_off = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(rows, out=row_off[1:])
        nnz_off = np.zeros(len(nnz) + 1, np.int64)
        np.cumsum(nnz, out=nnz_off[1:])
        n, cap = int(row_off[-1]), max(1, int(nnz_off[-1]))
        columns = {k: np.empty((n, *inner), dt) for k, (dt, inner) in other.items()}
        indptr = np.empty(n + 1, np.int64)
        indptr[0] = 0
        return Arena(np.asarray(shards, np.int64), row_off, nnz_off, indptr, pool.get(cap, np.dtype(np.int32)),
                     pool.get(cap, data_dtype), np.empty((len(int_keys), n), np.int64), int(n_cols), columns)

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


@dataclass
class Gathered:
    """The X rows of a batch as a CSR matrix (a copy: valid after its window is recycled)."""

    x: Any  # scipy.sparse.csr_matrix [m, G]
    shape: tuple[int, ...]  # dense shape (rows flattened over leading dims)

    def dense(self, out: np.ndarray | None = None) -> np.ndarray:
        """Dense float32 ``shape``, into ``out`` (a flat float32 buffer of ``size`` elements, e.g. a region
        of a shared buffer) when given. Without ``out`` scipy callocs the result: fresh zero pages, no memset
        (an ``out`` is zeroed first, which costs more than the densify itself)."""
        x = self.x if self.x.dtype == np.float32 else self.x.astype(np.float32)
        if out is None:
            return x.toarray().reshape(self.shape)
        x.toarray(out=out.reshape(x.shape))
        return out.reshape(self.shape)

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(crow int64 [m+1], cols int32 [nnz], vals [nnz])``."""
        return (self.x.indptr.astype(np.int64), self.x.indices.astype(np.int32, copy=False), self.x.data)


class Rows:
    """Rows to gather, possibly spread over several arenas (a batch straddling two windows)."""

    def __init__(self, arenas: Sequence[Arena], group: np.ndarray | None, rows: np.ndarray) -> None:
        self.arenas = list(arenas)
        self.rows = rows.reshape(-1)
        self.group = None if group is None or len(self.arenas) == 1 else np.broadcast_to(group, rows.shape).reshape(-1)

    def _groups(self) -> list[tuple[Arena, np.ndarray]]:
        assert self.group is not None
        return [(a, np.flatnonzero(self.group == i)) for i, a in enumerate(self.arenas)]

    def take(self, key: str) -> np.ndarray:
        if self.group is None:
            return np.take(self.arenas[0].columns[key], self.rows, axis=0)
        first = self.arenas[0].columns[key]
        out = np.empty((self.rows.size, *first.shape[1:]), first.dtype)
        for arena, sel in self._groups():
            out[sel] = np.take(arena.columns[key], self.rows[sel], axis=0)
        return out

    def take_ints(self) -> np.ndarray:
        """All integer metadata ``[k, m]`` as int64 (what embeddings and losses index with)."""
        if self.group is None:
            return np.take(self.arenas[0].ints, self.rows, axis=1)
        out = np.empty((self.arenas[0].ints.shape[0], self.rows.size), np.int64)
        for arena, sel in self._groups():
            out[:, sel] = np.take(arena.ints, self.rows[sel], axis=1)
        return out

    def gather(self, shape: tuple[int, ...]) -> Gathered:
        """The rows' X, in order (scipy's row gather: one C++ pass, no Python loop over rows)."""
        if self.group is None:
            return Gathered(self.arenas[0].x[self.rows], shape)
        groups = [(a, sel) for a, sel in self._groups() if sel.size]
        stacked = sp.vstack([a.x[self.rows[sel]] for a, sel in groups], format="csr")
        back = np.empty(self.rows.size, np.int64)
        back[np.concatenate([sel for _, sel in groups])] = np.arange(self.rows.size)
        return Gathered(stacked[back], shape)


def sparse(crow: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, n_cols: int) -> torch.Tensor:
    """A torch sparse CSR tensor ``[m, n_cols]`` (any device). Sentences come as ``[B*L, G]``."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        return torch.sparse_csr_tensor(crow, cols.to(torch.int64), vals.to(torch.float32),
                                       (crow.numel() - 1, n_cols), check_invariants=False)


@dataclass
class Payload:
    """A batch before transport: numpy arrays plus X fields gathered but not yet densified."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    xs: dict[str, Gathered] = field(default_factory=dict)


def to_tensors(p: Payload, output: str) -> dict[str, Any]:
    """Main-process transport: zero-copy tensors; X dense, sparse, or as parts ``.crow/.cols/.vals/.shape``."""
    batch: dict[str, Any] = {k: torch.from_numpy(v) for k, v in p.arrays.items()}
    for key, x in p.xs.items():
        if output == "dense":
            batch[key] = torch.from_numpy(x.dense())
            continue
        crow, cols, vals = (torch.from_numpy(a) for a in x.csr())
        if output == "sparse":
            batch[key] = sparse(crow, cols, vals, x.shape[-1])
        else:
            batch.update({key + s: a for s, a in zip(PARTS, (crow, cols, vals), strict=True)})
            batch[key + ".shape"] = x.shape
    return batch


def _shared_bytes(n: int) -> torch.Tensor:
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # the DataLoader will copy it into shared memory itself
        return torch.zeros(n, dtype=torch.uint8)
    # a fresh shared-memory object (shm_open + ftruncate) reads as zeros: no memset, no copy when pickled
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(n), 0, (n,), (1,))


def to_shared(p: Payload, output: str) -> dict[str, Any]:
    """Worker transport: one shared buffer + layout; dense X is densified straight into it."""
    layout: list[tuple[str, str, tuple[int, ...], int]] = []
    offset = 0

    def reserve(key: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        nonlocal offset
        layout.append((key, dtype.str, tuple(int(s) for s in shape), offset))
        offset += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // ALIGN) * ALIGN

    for k, v in p.arrays.items():
        reserve(k, v.dtype, v.shape)
    parts = {key: x.csr() for key, x in p.xs.items()} if output != "dense" else {}
    for key, x in p.xs.items():
        if output == "dense":
            reserve(key, np.dtype(np.float32), x.shape)
        else:
            for s, a in zip(PARTS, parts[key], strict=True):
                reserve(key + s, a.dtype, a.shape)
    buf = _shared_bytes(max(offset, ALIGN))
    raw = buf.numpy()

    def view(entry: tuple[str, str, tuple[int, ...], int]) -> np.ndarray:
        _, dt, shape, off = entry
        n = int(np.prod(shape, dtype=np.int64))
        return raw[off:off + n * np.dtype(dt).itemsize].view(dt)

    entries = {e[0]: e for e in layout}
    for k, v in p.arrays.items():
        view(entries[k])[...] = v.reshape(-1)
    extras: dict[str, Any] = {}
    for key, x in p.xs.items():
        if output == "dense":
            x.dense(out=view(entries[key]))
        else:
            for s, a in zip(PARTS, parts[key], strict=True):
                view(entries[key + s])[...] = a
            extras[key + ".shape"] = x.shape
    return {PACKED: buf, LAYOUT: (tuple(layout), output, extras)}
