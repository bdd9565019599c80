"""Row gathers, densify, and batch transport (the window arenas they read are :mod:`loaders.arena`).

Transport: in the main process batches are zero-copy tensors (:func:`to_tensors`). A DataLoader worker
ships ONE shared-memory buffer per batch (:func:`to_shared`, X densified straight into it): torch
otherwise creates a shared-memory segment per tensor (~1 ms each here). The consumer splits it back
into views (:func:`loaders.device.unpack_batch`), on the GPU after a single host-to-device copy.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from loaders.arena import ALIGN, DATA, INDICES, INDPTR, Arena, BufferPool, shard_units

__all__ = ["ALIGN", "DATA", "INDICES", "INDPTR", "Arena", "BufferPool", "Gathered", "Payload", "Rows", "shard_units",
           "sparse", "to_shared", "to_tensors"]
PACKED, LAYOUT = "__packed__", "__layout__"  # keys of a batch in shared-buffer transport
PARTS = (".crow", ".cols", ".vals")  # a CSR X shipped in parts: key + suffix


def _row_kernels() -> tuple[Any, Any] | None:
    """scipy's own C++ kernels behind ``x[rows]`` and ``toarray()``, called without the Python-level index
    validation around them (~150 of ~420 us per 256-row batch here: A/B in docs/LOADER.md). Our rows are
    in range by construction (every shard is validated before its window is served). ``_sparsetools`` is
    private, so it is checked once against the public API and ignored if it moved or disagrees."""
    try:
        from scipy.sparse import _sparsetools

        row_index, todense = _sparsetools.csr_row_index, _sparsetools.csr_todense
        x = sp.random(7, 5, density=0.5, format="csr", dtype=np.float32, random_state=0)
        rows = np.array([3, 0, 3, 6], x.indptr.dtype)
        nnz = x.indptr[rows + 1] - x.indptr[rows]
        crow = np.concatenate([[0], np.cumsum(nnz)]).astype(x.indptr.dtype)
        cols, vals = np.empty(int(crow[-1]), x.indices.dtype), np.empty(int(crow[-1]), x.dtype)
        row_index(rows.size, rows, x.indptr, x.indices, x.data, cols, vals)
        out = np.zeros((rows.size, 5), np.float32)
        todense(rows.size, 5, crow, cols, vals, out)
        return (row_index, todense) if np.array_equal(out, x[rows].toarray()) else None
    except Exception:  # not there, or a different signature: the public API does the same, slower
        return None


KERNELS = _row_kernels()


@dataclass
class Gathered:
    """The X rows of a batch in CSR parts (copies: valid after their window is recycled)."""

    indptr: np.ndarray  # [m+1], the dtype of ``indices``
    indices: np.ndarray  # [nnz]
    data: np.ndarray  # [nnz]
    shape: tuple[int, ...]  # dense shape (rows flattened over leading dims); shape[-1] is the gene count

    @staticmethod
    def rows_of(x: Any, rows: np.ndarray, shape: tuple[int, ...]) -> Gathered:
        """Rows ``rows`` of the CSR matrix ``x``, in order (one C++ pass, no Python loop over rows)."""
        if KERNELS is None:
            y = x[rows]
            return Gathered(y.indptr, y.indices, y.data, shape)
        ip = x.indptr
        r = rows.astype(ip.dtype, copy=False)
        crow = np.empty(r.size + 1, ip.dtype)
        crow[0] = 0
        np.cumsum(ip[r + 1] - ip[r], out=crow[1:])
        nnz = int(crow[-1])
        cols, vals = np.empty(nnz, x.indices.dtype), np.empty(nnz, x.data.dtype)
        KERNELS[0](r.size, r, ip, x.indices, x.data, cols, vals)
        return Gathered(crow, cols, vals, shape)

    def matrix(self) -> Any:
        return sp.csr_matrix((self.data, self.indices, self.indptr), shape=(self.indptr.size - 1, self.shape[-1]),
                             copy=False)

    def dense(self, out: np.ndarray | None = None) -> np.ndarray:
        """Dense float32 ``shape``, into ``out`` (a flat, zero-filled float32 buffer of ``size`` elements, e.g.
        a fresh shared buffer) when given. Without ``out`` the result is calloc'ed: fresh zero pages, no memset
        (zeroing an ``out`` costs more than the densify itself)."""
        m, g = self.indptr.size - 1, int(self.shape[-1])
        data = self.data if self.data.dtype == np.float32 else self.data.astype(np.float32)
        dense = np.zeros((m, g), np.float32) if out is None else out.reshape(m, g)
        if KERNELS is None:
            x = sp.csr_matrix((data, self.indices, self.indptr), shape=(m, g), copy=False)
            x.toarray(out=dense)
        else:
            KERNELS[1](m, g, self.indptr, self.indices, data, dense)
        return dense.reshape(self.shape)

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(crow int64 [m+1], cols int32 [nnz], vals [nnz])``."""
        return (self.indptr.astype(np.int64), self.indices.astype(np.int32, copy=False), self.data)


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
            return Gathered.rows_of(self.arenas[0].x, self.rows, shape)
        groups = [(a, sel) for a, sel in self._groups() if sel.size]
        stacked = sp.vstack([Gathered.rows_of(a.x, self.rows[sel], shape).matrix() for a, sel in groups],
                            format="csr")
        back = np.empty(self.rows.size, np.int64)
        back[np.concatenate([sel for _, sel in groups])] = np.arange(self.rows.size)
        return Gathered.rows_of(stacked, back, shape)


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
