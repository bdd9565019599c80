"""Batch transport: a :class:`~loaders.samples.payload.Payload` made into tensors (gathers:
:mod:`loaders.samples.gather`).

In the main process batches are zero-copy tensors (:func:`to_tensors`). A DataLoader worker ships
ONE buffer per run of consecutive batches (:func:`to_shared` -> :class:`Shipped`, finished values
written straight into it), in a reused slot of its :mod:`loaders.engine.ring` when one is free:
torch otherwise creates a shared-memory segment per tensor (~1 ms each here), and even one
segment per batch cost more than gathering it. The consumer splits it back into views
(:func:`loaders.engine.device.unpack_batches`), on the GPU after a single host-to-device copy.

``output`` (:data:`OUTPUTS`): ``"dense"`` finishes deferred items here (numpy); ``"parts"`` ships
every deferred item's parts so that the consumer finishes them (on the device:
:func:`loaders.engine.device.assemble`); ``"positions"`` is ``"parts"`` with every item in its device form
(:meth:`Deferred.for_device`), for a device that finishes them. Any other output is a *form name*:
``"dense"`` with each item in that form if it has one (:meth:`Deferred.as_form`: e.g. a sample
type's ``"csr"`` or ``"sparse"`` rows).

Whatever the output, an item whose :attr:`~Deferred.delivery` is ``PARTS`` reaches the user as its
parts, ``key.<part>`` tensors (zero-copy views of what the sample type made), and one of a
torch-only op (:func:`loaders.samples.ops.register_torch_only_op`) as its torch finisher's value. A shipped
item is ``key + "." + part`` tensors, plus ``key + META`` = (op, meta, part names) unless the user
gets the parts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from loaders.engine.ring import Ring, receive
from loaders.samples.arena import ALIGN, Arena, BufferPool
from loaders.samples.gather import BatchRows, Rows
from loaders.samples.ops import TORCH_OPS, is_torch_only
from loaders.samples.payload import PARTS, Deferred, Payload

__all__ = [
    "ALIGN",
    "META",
    "Arena",
    "BatchRows",
    "BufferPool",
    "Payload",
    "Rows",
    "RunShipping",
    "Shipped",
    "staging_buffer",
    "to_shared",
    "to_tensors",
]
META = ".meta"  # key + META: (op, meta, part names) of a shipped deferred item
OUTPUTS = ("dense", "parts", "positions")  # any other output names a form (``Deferred.as_form``)
FINISHED_BY_CONSUMER = (
    "parts",
    "positions",
)  # outputs whose shipped items carry META for the consumer


def _form(d: Deferred, output: str) -> Deferred:
    """The item as this output delivers it: in the form the output names, if not one of OUTPUTS."""
    return d if output in OUTPUTS else d.as_form(output)


def _shipped(d: Deferred, output: str) -> bool:
    """Whether the item's parts cross (else it is finished here, in numpy)."""
    return output in FINISHED_BY_CONSUMER or d.delivery == PARTS or is_torch_only(d.op)


def _as_shipped(d: Deferred, output: str) -> Deferred:
    """What a shipped item crosses as: its device form (:meth:`Deferred.for_device`) for
    ``"positions"`` (an item delivered as its parts keeps them: they are what the user gets)."""
    return d.for_device() if output == "positions" and d.delivery != PARTS else d


def _describe(
    d: Deferred, parts: dict[str, np.ndarray]
) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    return (d.op, d.meta(), tuple(parts))


def to_tensors(p: Payload, output: str) -> dict[str, Any]:
    """Main-process transport: zero-copy tensors; deferred items finished, delivered as parts, or
    shipped as parts for the consumer to finish."""
    batch: dict[str, Any] = {k: torch.from_numpy(v) for k, v in p.arrays.items()}
    for key, d in p.xs.items():
        d = _form(d, output)
        if not _shipped(d, output):
            batch[key] = torch.from_numpy(d.finish())
            continue
        d = _as_shipped(d, output)
        parts = d.parts()
        tensors = {n: torch.from_numpy(a) for n, a in parts.items()}
        if output in FINISHED_BY_CONSUMER or d.delivery == PARTS:
            batch.update({f"{key}.{n}": t for n, t in tensors.items()})
            if d.delivery != PARTS:
                batch[key + META] = _describe(d, parts)
        else:  # a torch-only op: its torch finisher, here
            batch[key] = TORCH_OPS.get(d.op)(tensors, d.meta())
    return batch


def _shared_bytes(n: int) -> torch.Tensor:
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # the DataLoader will copy it into shared memory itself
        return torch.zeros(n, dtype=torch.uint8)
    # a fresh shared-memory object (shm_open + ftruncate) reads as zeros: no memset, no copy when
    # pickled
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(n), 0, (n,), (1,))


Entry = tuple[
    str, str, tuple[int, ...], int
]  # (key, numpy dtype str, shape, byte offset in the buffer)


@dataclass
class Shipped:
    """What a worker ships for a run of consecutive batches: ONE uint8 buffer (a ring slot or a
    torch shared segment), each batch's layout (:data:`Entry` tuples) and its extras (a shipped
    item's op/meta), and the output form. The consumer splits it with
    :func:`loaders.engine.device.unpack_batches`, on whatever device the buffer now is. Pickles small
    when the buffer is a ring slot (:mod:`loaders.engine.ring`)."""

    buffer: torch.Tensor
    layouts: tuple[tuple[Entry, ...], ...]
    output: str
    extras: tuple[dict[str, Any], ...]
    slot: tuple[Ring, int] | None = None  # worker side: the ring slot ``buffer`` views

    def with_buffer(self, buffer: torch.Tensor) -> Shipped:
        """The same batches over another copy of the buffer (pinned, or on a device)."""
        return replace(self, buffer=buffer, slot=None)

    def pin_memory(self, device: Any = None) -> Shipped:
        """For the DataLoader's pin thread: one page-locked copy of the whole buffer (frees a ring
        slot)."""
        return self.with_buffer(self.buffer.pin_memory())

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self.slot is None:  # torch's reduction shares the segment
            return (Shipped, (self.buffer, self.layouts, self.output, self.extras))
        r, i = self.slot
        return (
            _from_ring,
            (
                r.id,
                r.registration(),
                i,
                int(self.buffer.numel()),
                self.layouts,
                self.output,
                self.extras,
            ),
        )


@dataclass(frozen=True)
class RunShipping:
    """How a ShardLoader's workers ship: runs of ``batches`` consecutive batches as one
    :class:`Shipped` item,
    in a ring of ``ring_slots`` reused slots per worker (:mod:`loaders.engine.ring`)."""

    batches: int
    ring_slots: int


def _from_ring(
    ring_id: str,
    registration: Any,
    slot: int,
    nbytes: int,
    layouts: tuple[tuple[Entry, ...], ...],
    output: str,
    extras: tuple[dict[str, Any], ...],
) -> Shipped:
    return Shipped(
        torch.from_numpy(receive(ring_id, registration, slot, nbytes)), layouts, output, extras
    )


def staging_buffer(n: int, pinned: bool) -> torch.Tensor:
    """``n`` bytes (old contents) to stage a batch for a device in; page-locked when ``pinned``
    (torch's caching host allocator recycles them once the copies that read them are done)."""
    return torch.empty(n, dtype=torch.uint8, pin_memory=pinned)


def to_shared(
    payloads: Sequence[Payload],
    output: str,
    ring: Ring | None = None,
    alloc: Callable[[int], torch.Tensor] | None = None,
) -> Shipped:
    """Worker transport: consecutive batches in ONE buffer (a free slot of the worker's ``ring`` if
    it has one, else a fresh shared segment); finished values are written straight into it.
    ``alloc(n)``: the buffer comes from there instead (the training process staging a batch for a
    device: pinned memory)."""
    layouts: list[tuple[Entry, ...]] = []
    offset = 0

    def reserve(layout: list[Entry], key: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        nonlocal offset
        layout.append((key, dtype.str, tuple(int(s) for s in shape), offset))
        offset += -(-math.prod(int(x) for x in shape) * dtype.itemsize // ALIGN) * ALIGN

    shipped_parts = []
    for p in payloads:
        layout: list[Entry] = []
        for k, v in p.arrays.items():
            reserve(layout, k, v.dtype, v.shape)
        items = {key: _form(d, output) for key, d in p.xs.items()}
        crossing = {key: _as_shipped(d, output) for key, d in items.items() if _shipped(d, output)}
        shipped = {key: d.parts() for key, d in crossing.items()}
        for key, d in items.items():
            if key in shipped:
                for n, a in shipped[key].items():
                    reserve(layout, f"{key}.{n}", a.dtype, a.shape)
            else:
                reserve(layout, key, d.out_dtype, d.out_shape())
        layouts.append(tuple(layout))
        shipped_parts.append((items, crossing, shipped))
    size = max(offset, ALIGN)
    slot = None if ring is None else ring.slot_for(size)
    zeroed = slot is None and alloc is None
    if alloc is not None:
        buf = alloc(size)  # holds old bytes
        raw = buf.numpy()
    elif slot is None:
        buf = _shared_bytes(size)  # reads as zeros
        raw = buf.numpy()
    else:
        raw = ring.view(slot, size)  # type: ignore[union-attr]  # holds an earlier item's bytes
        buf = torch.from_numpy(raw)

    def view(
        entry: Entry,
    ) -> np.ndarray:  # math.prod: np.prod costs ~5 us a call, 10% of a sparse batch
        _, dt, shape, off = entry
        dtype = np.dtype(dt)
        return raw[off : off + math.prod(shape) * dtype.itemsize].view(dtype)

    extras: list[dict[str, Any]] = []
    for p, layout, shipping in zip(payloads, layouts, shipped_parts, strict=True):
        items, crossing, shipped = shipping
        entries = {e[0]: e for e in layout}
        extra: dict[str, Any] = {}
        for k, v in p.arrays.items():
            view(entries[k])[...] = v.reshape(-1)
        for key, d in items.items():
            if key in shipped:
                for n, a in shipped[key].items():
                    view(entries[f"{key}.{n}"])[...] = a.reshape(-1)
                if crossing[key].delivery != PARTS:  # the consumer finishes it (else: no meta)
                    extra[key + META] = _describe(crossing[key], shipped[key])
            else:
                d.finish(out=view(entries[key]), zeroed=zeroed)
        extras.append(extra)
    return Shipped(
        buf, tuple(layouts), output, tuple(extras), None if slot is None else (ring, slot)
    )
