"""A ring of reused shared-memory slots per DataLoader worker: items shipped without a new segment
each.

Why: torch ships a tensor from a worker by creating a shared-memory segment (shm_open, ftruncate,
mmap) and passing its file descriptor through a socket (multiprocessing's resource sharer), and
the consumer maps it and unmaps it again: ~1-3 ms an item here, more than gathering the batch. A
:class:`Ring` creates ``slots`` memfd files once per worker and passes their descriptors once,
with the first item that uses it; every item then pickles as (ring, slot, layout), a few hundred
bytes. The consumer maps each slot once (:class:`Receiver`) and hands out views of it; the slot
goes back to the worker when the last view is garbage-collected (``weakref.finalize`` on the
numpy array every view derives from), through one state byte per slot in a shared control page.

memfd files live in the kernel's internal shm mount, not in ``/dev/shm``: a container's small
``/dev/shm`` (64 MiB by default in Docker) does not limit them. Their pages are allocated when
written, so a slot costs what the biggest item written into it needs; ``max_bytes`` caps the sum
per worker.

Fallback, still correct: no free slot (the consumer holds more items than the ring has), an item
larger than ``max_bytes``, or the ring at its cap -> ``slot_for`` says None and the caller makes
a torch shared segment.
"""

from __future__ import annotations

import mmap
import os
import uuid
import warnings
import weakref
from multiprocessing.reduction import DupFd
from typing import Any

import numpy as np

from loaders.format.forksafe import fork_safe_lock

FREE, BUSY = 0, 1
MAX_BYTES = 256 << 20  # written slot pages per worker, at most
AVAILABLE = hasattr(os, "memfd_create")


class Ring:
    """A worker's slots (see module docstring). ``slot_for(n)`` finds a free slot for ``n`` bytes
    and marks it busy; the consumer frees it. Not thread-safe by itself: one producer (the
    worker's iteration) uses it."""

    def __init__(self, slots: int, max_bytes: int = MAX_BYTES) -> None:
        if not AVAILABLE:
            raise OSError("memfd_create is not available on this platform")
        self.id, self.pid = uuid.uuid4().hex, os.getpid()
        self.n_slots, self.max_bytes = max(1, int(slots)), int(max_bytes)
        self.capacity = self.max_bytes  # virtual size of a slot: pages are allocated when written
        self.control_fd = os.memfd_create("shardsmith-ring-control", os.MFD_CLOEXEC)
        os.ftruncate(self.control_fd, mmap.PAGESIZE)
        self.control = mmap.mmap(self.control_fd, mmap.PAGESIZE)
        self.fds = [
            os.memfd_create(f"shardsmith-ring-{i}", os.MFD_CLOEXEC) for i in range(self.n_slots)
        ]
        for fd in self.fds:
            os.ftruncate(fd, self.capacity)
        self.maps = [mmap.mmap(fd, self.capacity) for fd in self.fds]
        self.used = [0] * self.n_slots  # bytes ever written per slot (its allocated pages)
        self.registered = False  # the descriptors went out with an item already
        weakref.finalize(self, _close, self.maps + [self.control], self.fds + [self.control_fd])

    def nbytes(self) -> int:
        """Shared memory this ring holds (pages written into its slots)."""
        return sum(self.used)

    def slot_for(self, nbytes: int) -> int | None:
        """A free slot that can take ``nbytes`` (now marked busy), or None: the caller falls back."""
        if nbytes > self.capacity:
            return None
        for i in range(
            self.n_slots
        ):  # the lowest free slot: the most recently used ones stay in cache
            if self.control[i] != FREE:
                continue
            grow = max(0, nbytes - self.used[i])
            if self.nbytes() + grow > self.max_bytes:
                continue
            self.used[i] = max(self.used[i], nbytes)
            self.control[i] = BUSY
            return i
        return None

    def view(self, slot: int, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of ``slot`` (uint8), to write an item into."""
        return np.frombuffer(self.maps[slot], np.uint8, nbytes)

    def registration(self) -> tuple[Any, ...] | None:
        """What the consumer needs to map this ring, sent once (with the first item pickled), else
        None."""
        if self.registered:
            return None
        self.registered = True
        return (
            self.pid,
            self.capacity,
            DupFd(self.control_fd),
            tuple(DupFd(fd) for fd in self.fds),
        )


_OWN: dict[int, Ring] = {}  # pid -> this worker process's ring


def worker_ring(slots: int) -> Ring | None:
    """This worker process's ring of ``slots`` (made on first use), or None: ship through fresh
    segments (``slots`` 0, no memfd here, or it could not be made: a warning says why)."""
    if slots < 1 or not AVAILABLE:
        return None
    pid = os.getpid()
    if pid not in _OWN or _OWN[pid].n_slots != slots:
        _OWN.clear()  # a forked worker does not keep its parent's
        try:
            _OWN[pid] = Ring(slots)
        except OSError as e:  # e.g. no descriptors left: ship as torch does, slower
            warnings.warn(
                f"no shared-memory ring for this DataLoader worker ({e}); batches go through fresh "
                "segments (slower)",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
    return _OWN[pid]


def _close(maps: list[mmap.mmap], fds: list[int]) -> None:
    for m in maps:
        try:
            m.close()
        except BufferError:  # views still exported: the mapping goes with them
            pass
    for fd in fds:
        os.close(fd)


class Receiver:
    """The consumer's side of one worker's ring: its slots mapped once, items handed out as views."""

    def __init__(self, pid: int, capacity: int, control: Any, slots: tuple[Any, ...]) -> None:
        self.pid = pid
        fds = [control.detach()] + [s.detach() for s in slots]
        try:
            self.control = mmap.mmap(fds[0], mmap.PAGESIZE)
            self.maps = [mmap.mmap(fd, capacity) for fd in fds[1:]]
        finally:
            for fd in fds:
                os.close(fd)

    def item(self, slot: int, nbytes: int) -> np.ndarray:
        """A fresh array over ``slot``'s first ``nbytes``; the slot is freed when it (and every
        view) is gone."""
        arr = np.frombuffer(self.maps[slot], np.uint8, nbytes)
        weakref.finalize(arr, _free, self.control, slot)
        return arr


def _free(control: mmap.mmap, slot: int) -> None:
    if not control.closed:
        control[slot] = FREE


_RECEIVERS: dict[str, Receiver] = {}
_LOCK = fork_safe_lock()  # a forked worker gets it unlocked (loaders/format/forksafe.py)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def receive(
    ring_id: str, registration: tuple[Any, ...] | None, slot: int, nbytes: int
) -> np.ndarray:
    """In the consumer: the item in ``slot`` of ring ``ring_id`` (mapped on its first item)."""
    with _LOCK:
        if registration is not None:
            for rid in [r for r, rec in _RECEIVERS.items() if not _alive(rec.pid)]:
                del _RECEIVERS[
                    rid
                ]  # exited workers' rings (their mappings live on in what still views them)
            _RECEIVERS[ring_id] = Receiver(*registration)
        try:
            receiver = _RECEIVERS[ring_id]
        except KeyError:
            raise RuntimeError(
                f"batch from an unknown worker ring {ring_id} (its first item was not received)"
            ) from None
    return receiver.item(slot, nbytes)


def receivers() -> list[int]:
    """The worker pids whose rings this process has mapped and still tracks (exited ones are dropped
    when the next ring registers)."""
    return [r.pid for r in _RECEIVERS.values()]
