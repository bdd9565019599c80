"""Vectorised batch assembly: window arenas, CSR row gathers, densification and batch transport.

A decoded window of shards becomes one :class:`Arena` (all rows concatenated) so that a batch, which
mixes the window's shards, is served by one gather instead of one per shard. Column indices and
values are interleaved into a single int64 array (``packed``: high half = int32 column, low half =
float32 bits): a batch gather is then one 8-byte ``np.take`` over contiguous runs instead of two, and
the dense destination ``row*G + col`` is ``((row*G << 32) + packed) >> 32`` in two contiguous int64 ops.
Integer metadata (cond_id, obs codes) sits in one ``[k, R]`` int32 matrix: one take for all of it.

Index arithmetic is numpy (``np.repeat`` + a cached ``arange``); the scatter is torch's ``scatter_``
into calloc'ed memory, the fastest densifier measured on CPU (docs/LOADER.md). No per-sample loops.

Transport: in the main process a batch is numpy arrays wrapped zero-copy by ``torch.from_numpy``.
In a DataLoader worker every tensor would become its own shared-memory segment (~1 ms each on some
hosts), so a batch is written into ONE shared buffer (X densified straight into it) plus a small
Python layout; the parent turns it back into views (:func:`unpack_batch`), on the GPU after a single
host-to-device copy.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from loaders.format import PAIRS, PRIMARY, SENTENCES_CTRL, SENTENCES_PERT, X

INDPTR, INDICES, DATA = f"{X}/indptr", f"{X}/indices", f"{X}/data"
PACKED, LAYOUT = "__packed__", "__layout__"  # keys of a batch in shared-buffer transport
ALIGN = 64
_HI, _LO = (1, 0) if sys.byteorder == "little" else (0, 1)  # int32 halves of a packed int64 word

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


def pack(indices: np.ndarray, data: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Interleave int32 columns and float32 values into int64 words (one gather moves both)."""
    out = np.empty(indices.size, np.int64) if out is None else out
    view = out.view(np.int32).reshape(-1, 2)
    view[:, _HI] = indices
    view[:, _LO] = data.view(np.int32) if data.dtype == np.float32 else data.astype(np.float32).view(np.int32)
    return out


def unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strided (cols int32, values float32) views of a packed array."""
    view = packed.view(np.int32).reshape(-1, 2)
    return view[:, _HI], view[:, _LO].view(np.float32)


@dataclass
class Arena:
    """One decoded window: its shards' rows concatenated, plus the rows each unit refers to."""

    shards: np.ndarray  # int64 [k]: shard ids, in concatenation order
    unit_offsets: np.ndarray  # int64 [k+1]: units of shard i are units[unit_offsets[i]:unit_offsets[i+1]]
    units: np.ndarray  # int64 [U, width]: arena rows per unit (cells: 1, pairs: ctrl|pert, sentences: pert*L|ctrl*L)
    indptr: np.ndarray  # int64 [R+1]
    packed: np.ndarray  # int64 [nnz]
    ints: np.ndarray  # int32 [len(int_keys), R]
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # other per-row columns (sample_id, obsm/*)

    @property
    def nbytes(self) -> int:
        return int(self.units.nbytes + self.indptr.nbytes + self.packed.nbytes + self.ints.nbytes
                   + sum(a.nbytes for a in self.columns.values()))

    def unit_rows(self, shard_idx: np.ndarray, local_idx: np.ndarray) -> np.ndarray:
        """Arena rows ``[m, width]`` of units given as (shard id, local unit id)."""
        srt = np.argsort(self.shards)
        slot = srt[np.searchsorted(self.shards, shard_idx, sorter=srt)]
        return self.units[self.unit_offsets[slot] + local_idx]


def shard_units(columns: Mapping[str, np.ndarray], sample: str) -> np.ndarray:
    """Local rows of a shard's units, ``[U, width]``."""
    if sample == "cells":
        return np.flatnonzero(columns[PRIMARY]).astype(np.int64)[:, None]
    if sample == "pairs":
        return columns[PAIRS].astype(np.int64).reshape(-1, 2)
    return np.concatenate([columns[SENTENCES_PERT], columns[SENTENCES_CTRL]], axis=1).astype(np.int64)


def build_arena(parts: Sequence[tuple[int, Mapping[str, np.ndarray]]], sample: str, int_keys: Sequence[str],
                other_keys: Sequence[str], width: int) -> Arena:
    """Concatenate decoded shards ``(shard id, columns)``; runs in the decode thread."""
    n_rows = np.array([c[INDPTR].size - 1 for _, c in parts], np.int64)
    n_nnz = np.array([c[INDPTR][-1] for _, c in parts], np.int64)
    row_off = np.concatenate([[0], np.cumsum(n_rows)]).astype(np.int64)
    nnz_off = np.concatenate([[0], np.cumsum(n_nnz)]).astype(np.int64)
    indptr = np.empty(int(row_off[-1]) + 1, np.int64)
    indptr[0] = 0
    packed = np.empty(int(nnz_off[-1]), np.int64)
    ints = np.empty((len(int_keys), int(row_off[-1])), np.int32)
    unit_list = []
    for i, (_, c) in enumerate(parts):
        rows = slice(row_off[i], row_off[i + 1])
        indptr[row_off[i] + 1:row_off[i + 1] + 1] = c[INDPTR][1:] + nnz_off[i]
        pack(c[INDICES], c[DATA], packed[nnz_off[i]:nnz_off[i + 1]])
        for j, k in enumerate(int_keys):
            ints[j, rows] = c[k]
        unit_list.append(shard_units(c, sample) + row_off[i])
    units = np.concatenate(unit_list) if unit_list else np.zeros((0, width), np.int64)
    unit_offsets = np.concatenate([[0], np.cumsum([u.shape[0] for u in unit_list])]).astype(np.int64)
    columns = {k: (parts[0][1][k] if len(parts) == 1 else np.concatenate([c[k] for _, c in parts])) for k in other_keys}
    shards = np.array([s for s, _ in parts], np.int64)
    return Arena(shards, unit_offsets, units.reshape(-1, width), indptr, packed, ints, columns)


class Rows:
    """Rows to gather, possibly spread over several arenas (a batch straddling two windows)."""

    def __init__(self, arenas: Sequence[Arena], group: np.ndarray | None, rows: np.ndarray) -> None:
        self.arenas, self.rows = list(arenas), rows.reshape(-1)
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
            return np.take(self.arenas[0].ints, self.rows, axis=1).astype(np.int64)
        out = np.empty((self.arenas[0].ints.shape[0], self.rows.size), np.int64)
        for arena, sel in self._groups():
            out[:, sel] = np.take(arena.ints, self.rows[sel], axis=1)
        return out

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``(crow int64 [m+1], packed int64 [nnz])`` of the rows, in order."""
        m = self.rows.size
        crow = np.empty(m + 1, np.int64)
        crow[0] = 0
        if self.group is None:
            indptr = self.arenas[0].indptr
            starts = indptr[self.rows]
            lens = indptr[self.rows + 1] - starts
            np.cumsum(lens, out=crow[1:])
            flat = np.repeat(starts - crow[:-1], lens)
            flat += arange(flat.size)
            return crow, np.take(self.arenas[0].packed, flat, mode="clip")
        starts = np.empty(m, np.int64)
        lens = np.empty(m, np.int64)
        groups = self._groups()
        for arena, sel in groups:
            starts[sel] = arena.indptr[self.rows[sel]]
            lens[sel] = arena.indptr[self.rows[sel] + 1] - starts[sel]
        np.cumsum(lens, out=crow[1:])
        out = np.empty(int(crow[-1]), np.int64)
        for arena, sel in groups:
            ln = lens[sel]
            offs = np.zeros(sel.size, np.int64)
            np.cumsum(ln[:-1], out=offs[1:])
            k = arange(int(ln.sum())) - np.repeat(offs, ln)
            out[np.repeat(crow[sel], ln) + k] = np.take(arena.packed, np.repeat(starts[sel], ln) + k, mode="clip")
        return crow, out


def densify(crow: np.ndarray, packed: np.ndarray, shape: Sequence[int], out: np.ndarray | None = None) -> np.ndarray:
    """Dense float32 ``shape`` (rows flattened over leading dims) from a packed CSR batch.

    ``out``: a zero-filled flat float32 buffer to scatter into (e.g. a region of a shared buffer).
    A 1-D ``scatter_`` is a serial loop in ATen: no intra-op threads competing with the trainer's.
    """
    n_cols, m = int(shape[-1]), crow.size - 1
    cols, vals = unpack(packed)
    if m * n_cols < 2**31:  # the column rides in the high half: shift it down together with the row offset
        flat = np.repeat((arange(m) * n_cols) << 32, np.diff(crow))
        flat += packed
        flat >>= 32
    else:
        flat = np.repeat(arange(m) * n_cols, np.diff(crow))
        flat += cols
    # np.zeros is calloc: fresh pages come zeroed from the kernel, torch.zeros memsets them (~100 us per 2 MB)
    out = np.zeros(m * n_cols, np.float32) if out is None else out
    torch.from_numpy(out).scatter_(0, torch.from_numpy(flat), torch.from_numpy(vals))
    return out.reshape(shape)


def densify_torch(crow: torch.Tensor, packed: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Device-side densify: the same scatter as :func:`densify`, with torch index arithmetic."""
    n_cols, m, dev = int(shape[-1]), crow.numel() - 1, crow.device
    pv = packed.view(torch.int32).view(-1, 2)
    rows = torch.repeat_interleave(torch.arange(m, device=dev, dtype=torch.int64) * n_cols, crow.diff(),
                                   output_size=packed.numel())
    out = torch.zeros(m * n_cols, dtype=torch.float32, device=dev)
    out.scatter_(0, rows + pv[:, _HI], pv[:, _LO].view(torch.float32))
    return out.view(*shape)


def sparse(crow: torch.Tensor, packed: torch.Tensor, n_cols: int) -> torch.Tensor:
    """A torch sparse CSR tensor ``[m, n_cols]`` (any device). Sentences come as ``[B*L, G]``."""
    pv = packed.view(torch.int32).view(-1, 2)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        return torch.sparse_csr_tensor(crow, pv[:, _HI].to(torch.int64), pv[:, _LO].view(torch.float32).contiguous(),
                                       (crow.numel() - 1, n_cols), check_invariants=False)


@dataclass
class Payload:
    """A batch before transport: numpy arrays plus CSR fields not yet densified."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    xs: dict[str, tuple[np.ndarray, np.ndarray, tuple[int, ...]]] = field(default_factory=dict)


def to_tensors(p: Payload, output: str) -> dict[str, Any]:
    """Main-process transport: zero-copy tensors; X dense, sparse, or as parts ``.crow/.packed/.shape``."""
    batch: dict[str, Any] = {k: torch.from_numpy(v) for k, v in p.arrays.items()}
    for key, (crow, packed, shape) in p.xs.items():
        if output == "dense":
            batch[key] = torch.from_numpy(densify(crow, packed, shape))
        elif output == "sparse":
            batch[key] = sparse(torch.from_numpy(crow), torch.from_numpy(packed), shape[-1])
        else:
            batch.update({key + ".crow": torch.from_numpy(crow), key + ".packed": torch.from_numpy(packed),
                          key + ".shape": shape})
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

    def reserve(key: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        nonlocal offset
        layout.append((key, dtype.str, tuple(int(s) for s in shape), offset))
        offset += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // ALIGN) * ALIGN

    for k, v in p.arrays.items():
        reserve(k, v.dtype, v.shape)
    for key, (crow, packed, shape) in p.xs.items():
        if output == "dense":
            reserve(key, np.dtype(np.float32), shape)
        else:
            reserve(key + ".crow", crow.dtype, crow.shape)
            reserve(key + ".packed", packed.dtype, packed.shape)
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
    for key, (crow, packed, shape) in p.xs.items():
        if output == "dense":
            densify(crow, packed, shape, out=view(entries[key]))
        else:
            view(entries[key + ".crow"])[...] = crow
            view(entries[key + ".packed"])[...] = packed
            extras[key + ".shape"] = shape
    return {PACKED: buf, LAYOUT: (tuple(layout), output, extras)}


_TORCH_DTYPES: dict[str, torch.dtype] = {}


def _torch_dtype(dt: str) -> torch.dtype:
    if dt not in _TORCH_DTYPES:
        _TORCH_DTYPES[dt] = torch.from_numpy(np.zeros(0, np.dtype(dt))).dtype
    return _TORCH_DTYPES[dt]


def unpack_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """Views into a shared-buffer batch (wherever the buffer now lives); other batches pass through."""
    if PACKED not in batch:
        return batch
    buf, (layout, output, extras) = batch[PACKED], batch[LAYOUT]
    out: dict[str, Any] = {}
    for key, dt, shape, off in layout:
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        out[key] = buf[off:off + n].view(_torch_dtype(dt)).view(shape)
    out.update(extras)
    if output == "sparse":  # the worker shipped parts; the sparse tensor is built here
        for key in [k[:-len(".crow")] for k in out if k.endswith(".crow")]:
            out[key] = sparse(out.pop(key + ".crow"), out.pop(key + ".packed"), out.pop(key + ".shape")[-1])
    return out


def assemble(batch: dict[str, Any], densify_x: bool) -> dict[str, Any]:
    """Turn shipped CSR parts back into dense (or sparse) tensors, on whatever device they are."""
    for key in [k[:-len(".crow")] for k in batch if k.endswith(".crow")]:
        crow, packed, shape = batch.pop(key + ".crow"), batch.pop(key + ".packed"), batch.pop(key + ".shape")
        if not densify_x:
            batch[key] = sparse(crow, packed, shape[-1])
        elif crow.device.type == "cpu":  # numpy index math: torch.zeros/repeat_interleave would use intra-op threads
            batch[key] = torch.from_numpy(densify(crow.numpy(), packed.numpy(), shape))
        else:
            batch[key] = densify_torch(crow, packed, shape)
    return batch
