"""Window arenas, block gathers, densify, and batch transport.

An *arena* is one decoded window, its shards' columns side by side: ``X/indices`` (int32) and ``X/data``
are decoded straight into ``cols``/``vals`` (:meth:`loaders.shardio.Column.read_into`), each shard at its
own offset with room for its edge chunk's padding; ``rows`` says where each row's entries are.

X is gathered in aligned *blocks* of 16 entries (64 bytes): one ``take`` of ~14 items per row and array
instead of one per entry, plus bookkeeping for the *foreign* entries sharing a row's first and last block
(:class:`Blocks`). In cells mode a window is *permuted* once, in the decode thread, into the epoch's order:
a batch is then a contiguous slice and costs only the densify (one add, one ``scatter_`` into calloc'ed
memory). Pairs and sentences reuse rows, so they gather per batch. Nothing loops over samples in Python.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from loaders.format import PAIRS, PRIMARY, SENTENCES_CTRL, SENTENCES_PERT, X

INDPTR, INDICES, DATA = f"{X}/indptr", f"{X}/indices", f"{X}/data"
PACKED, LAYOUT = "__packed__", "__layout__"  # keys of a batch in shared-buffer transport
PARTS = (".crow", ".cols", ".vals")  # a CSR X shipped in parts: key + suffix
ALIGN = 64
BLOCK, SHIFT = 16, 4  # X entries are gathered in aligned blocks of 16 (64 bytes of int32/float32)
RowSel = np.ndarray | slice  # arena rows: an index array, or a slice (a permuted window's batch)

_arange_lock = threading.Lock()
_arange_cache = np.arange(1 << 16, dtype=np.int64)


def arange(n: int) -> np.ndarray:
    """A read-only view of a cached ``arange``: allocating ~50k int64 per batch costs as much as a gather."""
    global _arange_cache
    cache = _arange_cache
    if n > cache.size:
        with _arange_lock:
            if n > _arange_cache.size:
                _arange_cache = np.arange(max(n, 2 * _arange_cache.size), dtype=np.int64)
            cache = _arange_cache
    return cache[:n]


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])`` without a Python loop."""
    offs = np.empty(counts.size + 1, np.int64)
    offs[0] = 0
    np.cumsum(counts, out=offs[1:])
    out = np.repeat(starts - offs[:-1], counts)
    out += arange(out.size)
    return out


class BufferPool:
    """Big 64-byte-aligned arrays recycled between windows (and epochs) of one process."""

    def __init__(self, keep: int = 4) -> None:
        self.keep, self.pid = keep, os.getpid()
        self._free: list[np.ndarray] = []  # raw uint8 buffers
        self._lock = threading.Lock()

    def get(self, n: int, dtype: np.dtype) -> np.ndarray:
        need = n * np.dtype(dtype).itemsize + ALIGN
        with self._lock:
            fits = [b for b in self._free if need <= b.size <= 2 * need]
            raw = min(fits, key=lambda b: b.size) if fits else None
            if raw is not None:
                self._free = [b for b in self._free if b is not raw]
        if raw is None:
            raw = np.empty(need + need // 32, np.uint8)  # headroom: the next window is a little bigger or smaller
        skip = -raw.ctypes.data % ALIGN
        return raw[skip:skip + need - ALIGN].view(dtype)

    def put(self, *arrays: np.ndarray) -> None:
        with self._lock:
            for a in arrays:
                raw = a
                while isinstance(raw.base, np.ndarray):
                    raw = raw.base
                if raw.dtype == np.uint8 and raw.ndim == 1 and all(raw is not b for b in self._free):
                    self._free.append(raw)
            del self._free[:-self.keep]


@dataclass
class Arena:
    """One decoded window: its shards' rows side by side, plus the rows each unit refers to."""

    shards: np.ndarray  # int64 [k]: shard ids, in concatenation order
    row_offsets: np.ndarray  # int64 [k+1]: rows of shard i are [row_offsets[i], row_offsets[i+1])
    nnz_offsets: np.ndarray  # int64 [k+1]: shard i's entries start at nnz_offsets[i] (padded chunks between)
    rows: np.ndarray  # int64 [R, 4]: per row (first entry, entries, first block, blocks) in cols/vals
    cols: np.ndarray  # int32 [cap], cap a multiple of BLOCK, 64-byte aligned
    vals: np.ndarray  # float32 [cap]
    ints: np.ndarray  # int64 [len(int_keys), R]
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # other per-row columns (sample_id, obsm/*)
    unit_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))  # int64 [k+1]
    units: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.int64))  # int64 [U, width] arena rows
    order: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # unit (row of units) per position
    permuted: bool = False  # rows are already in position order: position p is row p (units/order unused)
    foreign: np.ndarray | None = None  # permuted: positions in cols of entries in a row's blocks but not in it,
    foreign_crow: np.ndarray | None = None  # grouped by row: row i's are foreign[foreign_crow[i]:foreign_crow[i+1]]

    @staticmethod
    def allocate(shards: Sequence[int], rows: Sequence[int], caps: Sequence[int], int_keys: Sequence[str],
                 other: Mapping[str, tuple[np.dtype, tuple[int, ...]]], data_dtype: np.dtype,
                 pool: BufferPool) -> Arena:
        """Empty buffers for shards with ``rows[i]`` rows and ``caps[i]`` entry slots (room for padded chunks)."""
        row_off = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(rows, out=row_off[1:])
        nnz_off = np.zeros(len(caps) + 1, np.int64)
        np.cumsum(caps, out=nnz_off[1:])
        n, cap = int(row_off[-1]), -(-int(nnz_off[-1]) // BLOCK) * BLOCK
        columns = {k: np.empty((n, *inner), dt) for k, (dt, inner) in other.items()}
        return Arena(np.asarray(shards, np.int64), row_off, nnz_off, np.empty((n, 4), np.int64),
                     pool.get(cap, np.dtype(np.int32)), pool.get(cap, data_dtype),
                     np.empty((len(int_keys), n), np.int64), columns)

    def set_rows(self, i: int, indptr: np.ndarray) -> None:
        """Row pointers of shard ``i`` (its own ``X/indptr``), rebased to where its entries were decoded."""
        rows = self.rows[int(self.row_offsets[i]):int(self.row_offsets[i + 1])]
        start, size, first, blocks = (rows[:, j] for j in range(4))
        np.add(indptr[:-1], self.nnz_offsets[i], out=start)
        np.subtract(indptr[1:], indptr[:-1], out=size)
        np.right_shift(start, SHIFT, out=first)
        np.add(start, size + (BLOCK - 1), out=blocks)
        blocks >>= SHIFT
        blocks -= first

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

    def permute(self, pool: BufferPool, run: Callable[[Callable[[int], None], list[int]], Any] | None = None) -> Arena:
        """This window with its (width-1) units' rows in position order; X becomes whole blocks, 64-byte aligned.
        ``run(fn, [0, 1])`` may gather cols and vals on two threads (``take`` releases the GIL)."""
        rows = self.units[self.order, 0] if self.units.size else np.zeros(0, np.int64)
        info = np.take(self.rows, rows, axis=0)
        first = np.zeros(rows.size + 1, np.int64)
        np.cumsum(info[:, 3], out=first[1:])
        ids = _ranges(info[:, 2], info[:, 3])
        cols, vals = pool.get(ids.size * BLOCK, self.cols.dtype), pool.get(ids.size * BLOCK, self.vals.dtype)
        pairs = ((self.cols, cols), (self.vals, vals))

        def gather(i: int) -> None:
            np.take(pairs[i][0].reshape(-1, BLOCK), ids, axis=0, mode="clip", out=pairs[i][1].reshape(-1, BLOCK))

        (run or (lambda fn, xs: [fn(x) for x in xs]))(gather, [0, 1])
        info[:, 0] += (first[:-1] - info[:, 2]) << SHIFT  # same head offset inside the row's new first block
        info[:, 2] = first[:-1]
        head, tail = _head_tail(info)
        foreign_crow = np.zeros(rows.size + 1, np.int64)
        np.cumsum(head + tail, out=foreign_crow[1:])
        foreign = _ranges(np.stack([first[:-1] << SHIFT, (first[1:] << SHIFT) - tail], 1).reshape(-1),
                          np.stack([head, tail], 1).reshape(-1))
        return Arena(self.shards, self.row_offsets, self.nnz_offsets, info, cols, vals,
                     np.take(self.ints, rows, axis=1), {k: np.take(v, rows, axis=0) for k, v in self.columns.items()},
                     permuted=True, foreign=foreign, foreign_crow=foreign_crow)

    def release(self, pool: BufferPool) -> None:
        """Hand the big buffers back (the arena must not be used afterwards)."""
        pool.put(self.cols, self.vals)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.units, self.rows, self.cols, self.vals, self.ints, self.order,
                                          *self.columns.values())))


def shard_units(columns: Mapping[str, np.ndarray], sample: str) -> np.ndarray:
    """Local rows of a shard's units, ``[U, width]``."""
    if sample == "cells":
        return np.flatnonzero(columns[PRIMARY]).astype(np.int64)[:, None]
    if sample == "pairs":
        return columns[PAIRS].astype(np.int64).reshape(-1, 2)
    return np.concatenate([columns[SENTENCES_PERT], columns[SENTENCES_CTRL]], axis=1).astype(np.int64)


def _head_tail(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entries before and after a row's own in its blocks (``rows``: first entry, entries, first block, blocks)."""
    head = rows[:, 0] - (rows[:, 2] << SHIFT)
    return head, (rows[:, 3] << SHIFT) - head - rows[:, 1]


@dataclass
class Blocks:
    """The X rows of a batch as whole aligned blocks of ``BLOCK`` entries.

    A row's entries sit inside its blocks after ``head`` and before ``tail`` entries that belong to
    neighbouring rows; densify sends those to a scratch slot past the end of the output.
    """

    rows: np.ndarray  # int64 [m, 4] (first entry, entries, first block, blocks), entries/blocks in the source
    bcrow: np.ndarray  # int64 [m+1]: blocks of row i are cols[bcrow[i]:bcrow[i+1]]
    cols: np.ndarray  # int32 [n_blocks, BLOCK] (views of a permuted arena: use at once)
    vals: np.ndarray  # [n_blocks, BLOCK]
    shape: tuple[int, ...]  # dense shape (rows flattened over leading dims)

    known: np.ndarray | None = None  # foreign() when the window worked it out already

    def foreign(self) -> np.ndarray:
        """Positions (in the flattened blocks) of the head and tail entries that belong to other rows."""
        if self.known is not None:
            return self.known
        head, tail = _head_tail(self.rows)
        starts = np.concatenate([self.bcrow[:-1] << SHIFT, (self.bcrow[1:] << SHIFT) - tail])
        return _ranges(starts, np.concatenate([head, tail]))

    def dense(self, out: np.ndarray | None = None) -> np.ndarray:
        """Dense float32 ``shape``. ``out``: a zero-filled flat float32 buffer of at least ``size + 1``
        elements (e.g. a region of a shared buffer); the extra one receives the foreign entries.
        A 1-D ``scatter_`` is a serial loop in ATen: no intra-op threads competing with the trainer's."""
        n_cols, m = int(self.shape[-1]), self.bcrow.size - 1
        flat = np.repeat(arange(m) * n_cols, self.rows[:, 3] << SHIFT)
        flat += self.cols.reshape(-1)
        flat[self.foreign()] = m * n_cols
        # np.zeros is calloc: fresh pages come zeroed from the kernel, torch.zeros memsets them
        out = np.zeros(m * n_cols + 1, np.float32) if out is None else out
        vals = self.vals.reshape(-1)
        vals = vals if vals.dtype == np.float32 else vals.astype(np.float32)
        torch.from_numpy(out).scatter_(0, torch.from_numpy(flat), torch.from_numpy(vals))
        return out[:m * n_cols].reshape(self.shape)

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(crow int64 [m+1], cols int32 [nnz], vals [nnz])``: the blocks without foreign entries."""
        keep = np.ones(self.cols.size, bool)
        keep[self.foreign()] = False
        crow = np.zeros(self.bcrow.size, np.int64)
        np.cumsum(self.rows[:, 1], out=crow[1:])
        return crow, self.cols.reshape(-1)[keep], self.vals.reshape(-1)[keep]


class Rows:
    """Rows to gather, possibly spread over several arenas (a batch straddling two windows)."""

    def __init__(self, arenas: Sequence[Arena], group: np.ndarray | None, rows: RowSel) -> None:
        self.arenas = list(arenas)
        self.rows = rows if isinstance(rows, slice) else rows.reshape(-1)
        self.group = None if group is None or len(self.arenas) == 1 else np.broadcast_to(group, rows.shape).reshape(-1)

    def _groups(self) -> list[tuple[Arena, np.ndarray]]:
        assert self.group is not None and not isinstance(self.rows, slice)
        return [(a, np.flatnonzero(self.group == i)) for i, a in enumerate(self.arenas)]

    def take(self, key: str) -> np.ndarray:
        if isinstance(self.rows, slice):
            return self.arenas[0].columns[key][self.rows].copy()
        if self.group is None:
            return np.take(self.arenas[0].columns[key], self.rows, axis=0)
        first = self.arenas[0].columns[key]
        out = np.empty((self.rows.size, *first.shape[1:]), first.dtype)
        for arena, sel in self._groups():
            out[sel] = np.take(arena.columns[key], self.rows[sel], axis=0)
        return out

    def take_ints(self) -> np.ndarray:
        """All integer metadata ``[k, m]`` as int64 (what embeddings and losses index with)."""
        if isinstance(self.rows, slice):
            return self.arenas[0].ints[:, self.rows].copy()
        if self.group is None:
            return np.take(self.arenas[0].ints, self.rows, axis=1)
        out = np.empty((self.arenas[0].ints.shape[0], self.rows.size), np.int64)
        for arena, sel in self._groups():
            out[:, sel] = np.take(arena.ints, self.rows[sel], axis=1)
        return out

    def blocks(self, shape: tuple[int, ...]) -> Blocks:
        """The rows' X entries, in order, as :class:`Blocks` (a slice of a permuted arena: views, no copy)."""
        if isinstance(self.rows, slice):
            arena = self.arenas[0]
            rows = arena.rows[self.rows]
            bcrow = np.zeros(rows.shape[0] + 1, np.int64)
            np.cumsum(rows[:, 3], out=bcrow[1:])
            b0 = int(rows[0, 2]) if rows.shape[0] else 0
            sel = slice(b0, b0 + int(bcrow[-1]))
            known = None
            if arena.foreign is not None and arena.foreign_crow is not None:
                f0, f1 = arena.foreign_crow[self.rows.start], arena.foreign_crow[self.rows.stop]
                known = arena.foreign[f0:f1] - (b0 << SHIFT)
            return Blocks(rows, bcrow, arena.cols.reshape(-1, BLOCK)[sel], arena.vals.reshape(-1, BLOCK)[sel], shape,
                          known)
        m = self.rows.size
        bcrow = np.empty(m + 1, np.int64)
        bcrow[0] = 0
        if self.group is None:
            arena = self.arenas[0]
            rows = np.take(arena.rows, self.rows, axis=0)
            np.cumsum(rows[:, 3], out=bcrow[1:])
            ids = _ranges(rows[:, 2], rows[:, 3])
            # mode="clip" skips the per-item bounds check (ids are in range by construction)
            return Blocks(rows, bcrow, np.take(arena.cols.reshape(-1, BLOCK), ids, axis=0, mode="clip"),
                          np.take(arena.vals.reshape(-1, BLOCK), ids, axis=0, mode="clip"), shape)
        rows = np.empty((m, 4), np.int64)
        groups = self._groups()
        for arena, sel in groups:
            rows[sel] = np.take(arena.rows, self.rows[sel], axis=0)
        np.cumsum(rows[:, 3], out=bcrow[1:])
        cols = np.empty((int(bcrow[-1]), BLOCK), np.int32)
        vals = np.empty((int(bcrow[-1]), BLOCK), self.arenas[0].vals.dtype)
        for arena, sel in groups:
            dst, ids = _ranges(bcrow[sel], rows[sel, 3]), _ranges(rows[sel, 2], rows[sel, 3])
            cols[dst] = np.take(arena.cols.reshape(-1, BLOCK), ids, axis=0, mode="clip")
            vals[dst] = np.take(arena.vals.reshape(-1, BLOCK), ids, axis=0, mode="clip")
        return Blocks(rows, bcrow, cols, vals, shape)


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
    xs: dict[str, Blocks] = field(default_factory=dict)


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
    """Worker transport: one shared buffer + layout; dense X is scattered straight into it."""
    layout: list[tuple[str, str, tuple[int, ...], int]] = []
    offset = 0

    def reserve(key: str, dtype: np.dtype, shape: tuple[int, ...], extra: int = 0) -> None:
        nonlocal offset
        layout.append((key, dtype.str, tuple(int(s) for s in shape), offset))
        offset += -(-(int(np.prod(shape, dtype=np.int64)) + extra) * dtype.itemsize // ALIGN) * ALIGN

    for k, v in p.arrays.items():
        reserve(k, v.dtype, v.shape)
    parts = {key: x.csr() for key, x in p.xs.items()} if output != "dense" else {}
    for key, x in p.xs.items():
        if output == "dense":
            reserve(key, np.dtype(np.float32), x.shape, extra=1)  # + the slot for foreign block entries
        else:
            for s, a in zip(PARTS, parts[key], strict=True):
                reserve(key + s, a.dtype, a.shape)
    buf = _shared_bytes(max(offset, ALIGN))
    raw = buf.numpy()

    def view(entry: tuple[str, str, tuple[int, ...], int], extra: int = 0) -> np.ndarray:
        _, dt, shape, off = entry
        n = int(np.prod(shape, dtype=np.int64)) + extra
        return raw[off:off + n * np.dtype(dt).itemsize].view(dt)

    entries = {e[0]: e for e in layout}
    for k, v in p.arrays.items():
        view(entries[k])[...] = v.reshape(-1)
    extras: dict[str, Any] = {}
    for key, x in p.xs.items():
        if output == "dense":
            x.dense(out=view(entries[key], extra=1))
        else:
            for s, a in zip(PARTS, parts[key], strict=True):
                view(entries[key + s])[...] = a
            extras[key + ".shape"] = x.shape
    return {PACKED: buf, LAYOUT: (tuple(layout), output, extras)}
