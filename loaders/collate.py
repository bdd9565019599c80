"""Batch transport: a :class:`~loaders.payload.Payload` made into tensors (gathers: :mod:`loaders.gather`).

In the main process batches are zero-copy tensors (:func:`to_tensors`). A DataLoader worker ships ONE
shared-memory buffer per batch (:func:`to_shared`, finished values written straight into it): torch
otherwise creates a shared-memory segment per tensor (~1 ms each here). The consumer splits it back into
views (:func:`loaders.device.unpack_batch`), on the GPU after a single host-to-device copy.

``output`` (:data:`OUTPUTS`): ``"dense"`` finishes deferred items here (numpy); ``"csr"`` hands CSR rows over as
their three parts, ``key.crow`` / ``key.cols`` / ``key.vals`` (zero-copy views of the gather's output, index
dtypes as gathered: int32 below 2**31 entries), and finishes the other items; ``"sparse"`` makes CSR rows torch
sparse tensors; ``"parts"`` ships every deferred item's parts so that the consumer finishes them (on the
device: :func:`loaders.device.assemble`). A shipped item is ``key + "." + part`` tensors, plus
``key + META`` = (op, meta, part names) unless the output is ``"csr"`` (what the user gets carries no meta).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from loaders.arena import ALIGN, Arena, BufferPool
from loaders.gather import BatchRows, Rows
from loaders.payload import CSR_OP, Deferred, Gathered, Payload

__all__ = ["ALIGN", "META", "Arena", "BatchRows", "BufferPool", "Gathered", "Payload", "Rows", "sparse", "to_shared",
           "to_tensors"]
PACKED, LAYOUT = "__packed__", "__layout__"  # keys of a batch in shared-buffer transport
META = ".meta"  # key + META: (op, meta, part names) of a shipped deferred item
OUTPUTS = ("dense", "csr", "sparse", "parts")


def sparse(crow: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, n_cols: int) -> torch.Tensor:
    """A torch sparse CSR tensor ``[m, n_cols]`` (any device). Sentences come as ``[B*L, G]``. Indices stay in
    their dtype (torch takes int32 or int64, the same for both): no host-side conversion pass."""
    if crow.dtype != cols.dtype:
        crow, cols = crow.to(torch.int64), cols.to(torch.int64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        return torch.sparse_csr_tensor(crow, cols, vals if vals.dtype == torch.float32 else vals.to(torch.float32),
                                       (crow.numel() - 1, n_cols), check_invariants=False)


def _shipped(d: Deferred, output: str) -> bool:
    return output == "parts" or (output != "dense" and d.op == CSR_OP)


def _describe(d: Deferred, parts: dict[str, np.ndarray]) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    return (d.op, d.meta(), tuple(parts))


def to_tensors(p: Payload, output: str) -> dict[str, Any]:
    """Main-process transport: zero-copy tensors; deferred items finished, sparse, or shipped as parts."""
    batch: dict[str, Any] = {k: torch.from_numpy(v) for k, v in p.arrays.items()}
    for key, d in p.xs.items():
        if not _shipped(d, output):
            batch[key] = torch.from_numpy(d.finish())
            continue
        parts = d.parts()
        if output == "sparse":
            batch[key] = sparse(*(torch.from_numpy(parts[n]) for n in ("crow", "cols", "vals")), d.out_shape()[-1])
            continue
        batch.update({f"{key}.{n}": torch.from_numpy(a) for n, a in parts.items()})
        if output == "parts":
            batch[key + META] = _describe(d, parts)
    return batch


def _shared_bytes(n: int) -> torch.Tensor:
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # the DataLoader will copy it into shared memory itself
        return torch.zeros(n, dtype=torch.uint8)
    # a fresh shared-memory object (shm_open + ftruncate) reads as zeros: no memset, no copy when pickled
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(n), 0, (n,), (1,))


def to_shared(p: Payload, output: str) -> dict[str, Any]:
    """Worker transport: one shared buffer + layout; finished values are written straight into it."""
    layout: list[tuple[str, str, tuple[int, ...], int]] = []
    offset = 0

    def reserve(key: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        nonlocal offset
        layout.append((key, dtype.str, tuple(int(s) for s in shape), offset))
        offset += -(-int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // ALIGN) * ALIGN

    for k, v in p.arrays.items():
        reserve(k, v.dtype, v.shape)
    shipped = {key: d.parts() for key, d in p.xs.items() if _shipped(d, output)}
    for key, d in p.xs.items():
        if key in shipped:
            for n, a in shipped[key].items():
                reserve(f"{key}.{n}", a.dtype, a.shape)
        else:
            reserve(key, d.out_dtype, d.out_shape())
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
    for key, d in p.xs.items():
        if key in shipped:
            for n, a in shipped[key].items():
                view(entries[f"{key}.{n}"])[...] = a.reshape(-1)
            if output != "csr":
                extras[key + META] = _describe(d, shipped[key])
        else:
            d.finish(out=view(entries[key]))
    return {PACKED: buf, LAYOUT: (tuple(layout), output, extras)}
