"""Feeding batches ahead of use: a background prefetch thread, and the consumer side of batch transport.

:func:`prefetch` runs a batch generator in a thread a few items ahead (used for batch assembly).
:func:`unpack_batches`/:func:`assemble` turn what a worker shipped (one buffer for a run of batches, CSR
parts) back into tensors, on whatever device the buffer now is.

On CUDA: batches arrive pinned (the DataLoader's pin thread), are copied with ``non_blocking=True``
on a side stream ``depth`` batches ahead, and CSR parts are densified *there*: a 10%-dense batch
crosses PCIe at ~1/5 of its dense size and the GPU scatter is nearly free. A worker's item (a run of batches,
see loaders.collate) is one buffer: it crosses as a single copy and is split into views on the device. The
consumer's stream waits on an event per item, and every tensor is ``record_stream``-ed so the caching allocator
does not recycle it under the consumer.

``device="cpu"`` runs that same path (staging, side stream, finishing with the torch finishers, hand-over)
through :class:`Backend`, whose pinning, streams and events are no-ops on the CPU: CI exercises everything but
the CUDA calls themselves, and the batches equal the host path's exactly (tests/test_device_cpu.py).
``device=None`` leaves batches as the host made them (CSR parts, if shipped, finished with numpy).
"""

from __future__ import annotations

import importlib
import math
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

import numpy as np
import torch

from loaders.collate import META, Shipped, sparse
from loaders.payload import CSR_OP, TORCH_MODULES, get_op

Batch = dict[str, Any]
T = TypeVar("T")


def prefetch(make: Callable[[], Iterator[T]], depth: int, name: str) -> Iterator[T]:
    """The items of ``make()``, produced up to ``depth`` ahead in a daemon thread; its errors are re-raised here.
    Two C-level SimpleQueues (items, free slots): a bounded ``queue.Queue`` costs ~25% more per hand-over."""
    items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    slots: queue.SimpleQueue[None] = queue.SimpleQueue()
    for _ in range(max(1, depth)):
        slots.put(None)
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                slots.get(timeout=0.05)
            except queue.Empty:
                continue
            items.put(item)
            return True
        return False

    def run() -> None:
        gen = make()
        try:
            for x in gen:
                if not put(("item", x)):
                    return
            put(("end", None))
        except BaseException as e:  # handed to the consumer, which re-raises it (errors name the shard)
            put(("error", e))
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        while True:
            kind, x = items.get()
            slots.put(None)
            if kind == "end":
                return
            if kind == "error":
                raise x
            yield x
    finally:
        stop.set()
        thread.join(timeout=1.0)  # a producer inside a long decode finishes on its own (daemon)


def densify(crow: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Dense float32 ``shape`` (rows flattened over leading dims) from shipped CSR parts, on the CPU."""
    return get_op(CSR_OP)({"crow": crow, "cols": cols, "vals": vals}, {"shape": list(shape)}, None)


def densify_torch(crow: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Device-side densify (what :func:`densify` does on the CPU): one ``scatter_`` with torch index arithmetic."""
    n_cols, m, dev = int(shape[-1]), crow.numel() - 1, crow.device
    rows = torch.repeat_interleave(torch.arange(m, device=dev, dtype=torch.int64) * n_cols,
                                   crow.diff().to(torch.int64), output_size=cols.numel())
    out = torch.zeros(m * n_cols, dtype=torch.float32, device=dev)
    out.scatter_(0, rows + cols, vals.to(torch.float32))
    return out.view(*shape)


TorchFinish = Callable[[Mapping[str, torch.Tensor], Mapping[str, Any]], torch.Tensor]
TORCH_OPS: dict[str, TorchFinish] = {}


def register_torch_op(name: str) -> Callable[[TorchFinish], TorchFinish]:
    """Register the torch finisher of deferred op ``name`` (its numpy twin: ``loaders.payload.register_op``)."""

    def deco(fn: TorchFinish) -> TorchFinish:
        TORCH_OPS[name] = fn
        return fn

    return deco


@register_torch_op(CSR_OP)
def _csr_dense_torch(parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> torch.Tensor:
    return densify_torch(parts["crow"], parts["cols"], parts["vals"], [int(s) for s in meta["shape"]])


def finish(op: str, parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any], on_device: bool = False
           ) -> torch.Tensor:
    """A shipped deferred item finished where its parts are: numpy on the CPU (no intra-op torch threads),
    the registered torch finisher on a device, or on the CPU when ``on_device`` (``device="cpu"``: the device
    path run on the host, so that CI exercises it)."""
    first = next(iter(parts.values()))
    if op not in TORCH_OPS and op in TORCH_MODULES:
        importlib.import_module(TORCH_MODULES[op])
    if (first.device.type == "cpu" and not (on_device and op in TORCH_OPS)) or op not in TORCH_OPS:
        if op not in TORCH_OPS and first.device.type != "cpu":
            raise ValueError(f"deferred op {op!r} has no torch finisher (register one with register_torch_op)")
        return torch.from_numpy(get_op(op)({k: v.numpy() for k, v in parts.items()}, meta, None))
    return TORCH_OPS[op](parts, meta)


_TORCH_DTYPES: dict[str, torch.dtype] = {}


def _torch_dtype(dt: str) -> torch.dtype:
    if dt not in _TORCH_DTYPES:
        _TORCH_DTYPES[dt] = torch.from_numpy(np.zeros(0, np.dtype(dt))).dtype
    return _TORCH_DTYPES[dt]


def _shipped_keys(batch: Mapping[str, Any]) -> list[str]:
    return [k[:-len(META)] for k in batch if k.endswith(META)]


def _pop(batch: dict[str, Any], key: str) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    op, meta, names = batch.pop(key + META)
    return op, meta, {n: batch.pop(f"{key}.{n}") for n in names}


def unpack_batches(item: Shipped) -> list[Batch]:
    """The batches of a worker's item: views into its one buffer, wherever the buffer now lives. On the host
    the views are numpy's (with ``torch.from_numpy``: ~8x cheaper than slicing a tensor per field)."""
    buf = item.buffer
    raw = buf.numpy() if buf.device.type == "cpu" else None
    out: list[Batch] = []
    for layout, extras in zip(item.layouts, item.extras, strict=True):
        batch: Batch = {}
        for key, dt, shape, off in layout:
            n = math.prod(shape) * np.dtype(dt).itemsize
            if raw is not None:
                batch[key] = torch.from_numpy(raw[off:off + n].view(dt).reshape(shape))
            else:
                batch[key] = buf[off:off + n].view(_torch_dtype(dt)).view(shape)
        batch.update(extras)
        if item.output == "sparse":  # the worker shipped CSR parts; the sparse tensor is built here
            for key in _shipped_keys(batch):
                op, meta, parts = _pop(batch, key)
                batch[key] = sparse(parts["crow"], parts["cols"], parts["vals"], int(meta["shape"][-1]))
        out.append(batch)
    return out


def batches_of(item: Batch | Shipped) -> list[Batch]:
    """A worker's item as batches; a main-process batch is one batch."""
    return unpack_batches(item) if isinstance(item, Shipped) else [item]


def assemble(batch: dict[str, Any], csr: str = "dense", on_device: bool = False) -> dict[str, Any]:
    """Finish shipped deferred items where they are. CSR rows become ``csr``: ``"dense"`` (densified),
    ``"csr"`` (the three part tensors, as the user asked with ``densify=False``) or ``"sparse"`` (a torch
    sparse CSR tensor); other ops are always finished."""
    for key in _shipped_keys(batch):
        op, meta, parts = _pop(batch, key)
        if op == CSR_OP and csr == "csr":
            batch.update({f"{key}.{n}": t for n, t in parts.items()})
        elif op == CSR_OP and csr == "sparse":
            batch[key] = sparse(parts["crow"], parts["cols"], parts["vals"], int(meta["shape"][-1]))
        else:
            batch[key] = finish(op, parts, meta, on_device)
    return batch


def _components(t: torch.Tensor) -> list[torch.Tensor]:
    if t.layout == torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t]


class Backend:
    """What differs between feeding a CUDA device and feeding the CPU through the same steps: pinning, the side
    stream, events. On the CPU every one is a no-op, so ``device="cpu"`` runs the whole device path (staging,
    copy, on-device finish with the torch finishers, hand-over) and only these CUDA calls go untested in CI."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def stream(self) -> Any:
        return torch.cuda.Stream(device=self.device) if self.cuda else None

    def on(self, stream: Any) -> Any:
        return torch.cuda.stream(stream) if self.cuda else nullcontext()

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """A page-locked staging copy (the DataLoader's pin thread usually made it already)."""
        return t.pin_memory() if self.cuda and not t.is_pinned() else t

    def event(self, stream: Any) -> Any:
        if not self.cuda:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, event: Any) -> None:
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(event)

    def consumer(self) -> Any:
        """The stream the consumer (the training loop) runs on; None on the CPU."""
        return torch.cuda.current_stream(self.device) if self.cuda else None

    def keep(self, t: torch.Tensor, consumer: Any) -> None:
        """Tell the caching allocator the ``consumer`` stream uses ``t`` (allocated on the side stream)."""
        if consumer is not None and t.is_cuda:
            t.record_stream(consumer)


def stage(item: Batch | Shipped, backend: Backend) -> Batch | Shipped:
    """Host tensors in staging (pinned) memory; layouts and shapes stay Python values."""
    if isinstance(item, Shipped):
        return item.with_buffer(backend.pin(item.buffer)) if item.buffer.device.type == "cpu" else item
    return {k: backend.pin(v) if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v
            for k, v in item.items()}


class DeviceFeeder:
    """Turns an iterable of host batches into batches on ``device`` (see module docstring). ``device=None``:
    batches stay as the host made them; any device, ``"cpu"`` included, goes through :class:`Backend`."""

    def __init__(self, device: torch.device | str | None, depth: int = 2, csr: str = "dense") -> None:
        self.device = None if device is None else torch.device(device)
        self.cuda = self.device is not None and self.device.type == "cuda" and torch.cuda.is_available()
        self.depth = max(1, int(depth))
        self.csr = csr  # what shipped CSR rows become: "dense", "csr" (parts) or "sparse" (see assemble)

    def _move(self, item: Batch | Shipped) -> Batch | Shipped:
        assert self.device is not None
        if isinstance(item, Shipped):  # one copy for the whole run of batches
            return item.with_buffer(item.buffer.to(self.device, non_blocking=True))
        # layouts and shapes are Python values and stay on the host: reading them never synchronises
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in item.items()}

    def __call__(self, items: Iterable[Batch | Shipped]) -> Iterator[Batch]:
        """Batches from ``items``: main-process batches, or workers' runs of batches (:class:`Shipped`)."""
        if self.device is None or (self.device.type == "cuda" and not self.cuda):
            for item in items:
                for batch in batches_of(item):
                    yield assemble(batch, self.csr)
            return
        backend = Backend(self.device)
        stream = backend.stream()
        staged: deque[tuple[list[Batch], Any]] = deque()
        ready = 0  # batches staged
        for item in items:
            with backend.on(stream):
                moved = [assemble(b, self.csr, on_device=True) for b in batches_of(self._move(stage(item, backend)))]
                event = backend.event(stream)
            staged.append((moved, event))
            ready += len(moved)
            while staged and ready - len(staged[0][0]) >= self.depth:  # keep ``depth`` batches staged ahead
                done, ev = staged.popleft()
                ready -= len(done)
                yield from self._hand_over(done, ev, backend)
        while staged:
            yield from self._hand_over(*staged.popleft(), backend)

    @staticmethod
    def _hand_over(batches: list[Batch], event: Any, backend: Backend) -> Iterator[Batch]:
        backend.wait(event)
        consumer = backend.consumer()  # looked up once an item: ~30 us a call on CUDA
        for batch in batches:
            if consumer is not None:
                for value in batch.values():
                    if isinstance(value, torch.Tensor):
                        for t in _components(value):
                            backend.keep(t, consumer)
            yield batch
