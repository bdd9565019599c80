"""Feeding batches ahead of use: a background prefetch thread, and the consumer side of batch
transport.

:func:`prefetch` runs a batch generator in a thread a few items ahead (used for batch assembly).
:func:`unpack_batches`/:func:`assemble` turn what a worker shipped (one buffer for a run of
batches, the parts of deferred items) back into tensors, on whatever device the buffer now is.

On CUDA: batches arrive pinned (the DataLoader's pin thread), are copied with
``non_blocking=True`` on a side stream ``depth`` batches ahead, and deferred items are finished
*there*, each crossing in its device form (``Deferred.for_device``: e.g. sparse rows as flat
positions and values, ~1/3 of the dense bytes at 10% density, made dense with one zero-fill and
one scatter). A worker's item (a run of batches, see loaders.engine.transport) is one buffer: it crosses
as a single copy and is cut into views on the device (:class:`TorchViews`). The training thread's
cost per batch is what bounds this path (launches and dispatches: docs/LOADER.md, "On a GPU"),
hence the fewest ops per batch. The consumer's stream waits on an event per item; the buffer and
every finished value are ``record_stream``-ed so the caching allocator does not recycle them
under the consumer.

``device="cpu"`` runs that same path (staging, side stream, finishing with the torch finishers,
hand-over) through :class:`Backend`, whose pinning, streams and events are no-ops on the CPU: CI
exercises everything but the CUDA calls themselves, and the batches equal the host path's exactly
(tests/loaders/test_device_cpu.py). ``device=None`` leaves batches as the host made them (shipped parts,
if any, finished with numpy).
"""

from __future__ import annotations

import math
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from loaders.engine.transport import META, Shipped
from loaders.samples.ops import TORCH_OPS, get_op, is_torch_only

Batch = dict[str, Any]
T = TypeVar("T")


def prefetch(make: Callable[[], Iterator[T]], depth: int, name: str) -> Iterator[T]:
    """The items of ``make()``, produced up to ``depth`` ahead in a daemon thread; its errors are
    re-raised here. Two C-level SimpleQueues (items, free slots): a bounded ``queue.Queue`` costs
    ~25% more per hand-over."""
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
        except (
            BaseException
        ) as e:  # handed to the consumer, which re-raises it (errors name the shard)
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


TorchFinish = Callable[[Mapping[str, torch.Tensor], Mapping[str, Any]], torch.Tensor]


def register_torch_op(name: str) -> Callable[[TorchFinish], TorchFinish]:
    """Register the torch finisher of deferred op ``name`` (its numpy twin:
    ``loaders.samples.payload.register_op``)."""

    def deco(fn: TorchFinish) -> TorchFinish:
        return TORCH_OPS.register(name, fn)

    return deco


def finish(
    op: str, parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any], on_device: bool = False
) -> torch.Tensor:
    """A shipped deferred item finished where its parts are: numpy on the CPU (no intra-op torch
    threads), the registered torch finisher on a device, or on the CPU when ``on_device``
    (``device="cpu"``: the device path run on the host, so that CI exercises it) or the op is
    torch-only."""
    first = next(iter(parts.values()))
    has_torch = op in TORCH_OPS
    if has_torch:
        finisher = TORCH_OPS.get(op)  # imports the module that registers it, on first use
        if is_torch_only(op):
            return finisher(parts, meta)
    if (first.device.type == "cpu" and not (on_device and has_torch)) or not has_torch:
        if not has_torch and first.device.type != "cpu":
            raise ValueError(
                f"deferred op {op!r} has no torch finisher (register one with register_torch_op)"
            )
        return torch.from_numpy(get_op(op)({k: v.numpy() for k, v in parts.items()}, meta, None))
    return finisher(parts, meta)


_TORCH_DTYPES: dict[str, torch.dtype] = {}


def _torch_dtype(dt: str) -> torch.dtype:
    if dt not in _TORCH_DTYPES:
        _TORCH_DTYPES[dt] = torch.from_numpy(np.zeros(0, np.dtype(dt))).dtype
    return _TORCH_DTYPES[dt]


def _shipped_keys(batch: Mapping[str, Any]) -> list[str]:
    return [k[: -len(META)] for k in batch if k.endswith(META)]


def _pop(batch: dict[str, Any], key: str) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    op, meta, names = batch.pop(key + META)
    return op, meta, {n: batch.pop(f"{key}.{n}") for n in names}


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for s in reversed(shape):
        out.append(step)
        step *= s
    return tuple(reversed(out))


class TorchViews:
    """Fields of one device buffer as tensors: one typed view of the whole buffer per dtype, then
    ONE ``as_strided`` per field (slice + view + view cost three dispatches, ~8 us a field on an
    H100 node's CPU: ~20 fields a batch). Offsets are multiples of ALIGN, hence of every
    itemsize."""

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf
        self.typed: dict[str, tuple[torch.Tensor, int]] = {}

    def __call__(self, dt: str, shape: tuple[int, ...], off: int) -> torch.Tensor:
        typed = self.typed.get(dt)
        if typed is None:
            size = np.dtype(dt).itemsize
            typed = self.typed[dt] = (
                self.buf[: self.buf.numel() // size * size].view(_torch_dtype(dt)),
                size,
            )
        return typed[0].as_strided(shape, _strides(shape), off // typed[1])


def unpack_batches(item: Shipped) -> list[Batch]:
    """The batches of a worker's item: views into its one buffer, wherever the buffer now lives. On
    the host the views are numpy's (with ``torch.from_numpy``: ~8x cheaper than slicing a tensor
    per field); on a device, :class:`TorchViews`."""
    buf = item.buffer
    raw = buf.numpy() if buf.device.type == "cpu" else None
    views = TorchViews(buf) if raw is None else None
    out: list[Batch] = []
    for layout, extras in zip(item.layouts, item.extras, strict=True):
        batch: Batch = {}
        for key, dt, shape, off in layout:
            if views is None:
                n = math.prod(shape) * np.dtype(dt).itemsize
                batch[key] = torch.from_numpy(raw[off : off + n].view(dt).reshape(shape))  # type: ignore[index]
            else:
                batch[key] = views(dt, shape, off)
        batch.update(extras)
        out.append(batch)
    return out


def batches_of(item: Batch | Shipped) -> list[Batch]:
    """A worker's item as batches; a main-process batch is one batch."""
    return unpack_batches(item) if isinstance(item, Shipped) else [item]


def assemble(
    batch: dict[str, Any], form: str | None = None, on_device: bool = False
) -> dict[str, Any]:
    """Finish the shipped deferred items (those with ``key + META``) where they are. What an item
    becomes was decided where its batch was made (its op, its delivery: :mod:`loaders.samples.payload`);
    ``form`` is accepted for callers of the old signature and changes nothing."""
    for key in _shipped_keys(batch):
        op, meta, parts = _pop(batch, key)
        batch[key] = finish(op, parts, meta, on_device)
    return batch


def _components(t: torch.Tensor) -> list[torch.Tensor]:
    if t.layout == torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t]


class Backend:
    """What differs between feeding a CUDA device and feeding the CPU through the same steps:
    pinning, the side stream, events. On the CPU every one is a no-op, so ``device="cpu"`` runs
    the whole device path (staging, copy, on-device finish with the torch finishers, hand-over)
    and only these CUDA calls go untested in CI."""

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
        """Tell the caching allocator the ``consumer`` stream uses ``t`` (allocated on the side
        stream)."""
        if consumer is not None and t.is_cuda:
            t.record_stream(consumer)


def stage(item: Batch | Shipped, backend: Backend) -> Batch | Shipped:
    """Host tensors in staging (pinned) memory; layouts and shapes stay Python values."""
    if isinstance(item, Shipped):
        return (
            item.with_buffer(backend.pin(item.buffer)) if item.buffer.device.type == "cpu" else item
        )
    return {
        k: backend.pin(v) if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v
        for k, v in item.items()
    }


class DeviceFeeder:
    """Turns an iterable of host batches into batches on ``device`` (see module docstring).
    ``device=None``: batches stay as the host made them; any device, ``"cpu"`` included, goes
    through
    :class:`Backend`."""

    def __init__(self, device: torch.device | str | None, depth: int = 2) -> None:
        self.device = None if device is None else torch.device(device)
        self.cuda = (
            self.device is not None and self.device.type == "cuda" and torch.cuda.is_available()
        )
        self.depth = max(1, int(depth))

    def _move(self, item: Batch | Shipped) -> Batch | Shipped:
        assert self.device is not None
        if isinstance(item, Shipped):  # one copy for the whole run of batches
            return item.with_buffer(item.buffer.to(self.device, non_blocking=True))
        # layouts and shapes are Python values and stay on the host: reading them never synchronises
        return {
            k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in item.items()
        }

    def __call__(self, items: Iterable[Batch | Shipped]) -> Iterator[Batch]:
        """Batches from ``items``: main-process batches, or workers' runs of batches
        (:class:`Shipped`)."""
        if self.device is None or (self.device.type == "cuda" and not self.cuda):
            for item in items:
                for batch in batches_of(item):
                    yield assemble(batch)
            return
        backend = Backend(self.device)
        stream = backend.stream()
        staged: deque[Staged] = deque()
        ready = 0  # batches staged
        for item in items:
            with backend.on(stream):
                moved = self._move(stage(item, backend))
                shared = moved.buffer if isinstance(moved, Shipped) else None
                batches = []
                for b in batches_of(moved):
                    # in one buffer, only what the finishers allocate is not a view of it (see
                    # _hand_over)
                    fresh = _shipped_keys(b) if shared is not None else None
                    batches.append((assemble(b, on_device=True), fresh))
                event = backend.event(stream)
            staged.append(Staged(batches, event, shared))
            ready += len(batches)
            while (
                staged and ready - len(staged[0].batches) >= self.depth
            ):  # keep ``depth`` batches staged ahead
                done = staged.popleft()
                ready -= len(done.batches)
                yield from self._hand_over(done, backend)
        while staged:
            yield from self._hand_over(staged.popleft(), backend)

    @staticmethod
    def _hand_over(staged: Staged, backend: Backend) -> Iterator[Batch]:
        """Batches usable on the consumer's stream: it waits for the item's copy and finish, and the
        caching allocator learns that the consumer uses their memory (``record_stream``): once
        for the item's buffer, which every view of it shares, then per finished value (allocated
        on the side stream)."""
        backend.wait(staged.event)
        consumer = backend.consumer()  # looked up once an item: ~30 us a call on CUDA
        if consumer is not None and staged.shared is not None:
            backend.keep(staged.shared, consumer)
        for batch, fresh in staged.batches:
            if consumer is not None:
                values = (
                    batch.values() if fresh is None else [batch[k] for k in fresh if k in batch]
                )
                for value in values:
                    if isinstance(value, torch.Tensor):
                        for t in _components(value):
                            backend.keep(t, consumer)
            yield batch


@dataclass
class Staged:
    """An item on its way to the consumer: its batches (each with the keys whose values the
    finishers made, or None: every value is its own allocation), the event its copy and finish
    recorded, its device buffer."""

    batches: list[tuple[Batch, list[str] | None]]
    event: Any
    shared: torch.Tensor | None
