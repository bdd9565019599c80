"""Buffers reused from one chunk, block and task to the next, one set per thread.

Why: on this kind of VM a fresh page costs about as much as copying it (a fault, and the kernel
zeroes it, 2 MiB at a time under transparent huge pages), and the build's chunk-sized temporaries
are all fresh pages: above the 1 MiB mmap threshold the build sets (`pipeline.memory`) each one is
a new mapping, returned at free. In a 2M-cell build a fifth of the CPU samples were page faults
(`perf record -g`: reads into fresh blocks, gathers into fresh chunks). A thread's `Scratch`
keeps them instead: the pack's working set (a few chunks) stays mapped for the thread's life,
which is what its peak held anyway.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import numpy as np

# Entries staged before a row gather: a source block's entry arrays as read, or a chunk's spilled
# entries. One role, so the two never hold separate buffers: a task reads its source before it
# packs (`pipeline.modalities.perturbation.pack`).
STAGE = "stage-"
# Entries after a row gather: a source block's rows of one shard (spilled at once), or a chunk's
# rows in planned order. Shared for the same reason: a thread that reads holds no more buffers
# than one that packs.
GATHERED = "gathered-"


class Scratch:
    """Named buffers, each grown as needed and handed out as a view of its start.

    A view is valid until the next `get` of the same name. `owner` lets a user of several views
    check that nobody got a buffer since it filled them (every `get` clears it; `ShardRows` keeps
    its last chunk that way).
    Buffers are typed, not bytes viewed as a type: scipy copies an index or data array whose base
    is over twice its size (`_prune_array`, on every CSR it checks), and a byte buffer's view is
    always that."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}
        self.owner: object = None

    def get(self, name: str, dtype: np.dtype | type, n: int) -> np.ndarray:
        self.owner = None
        dt = np.dtype(dtype)
        buf = self.buffers.get(name)
        if buf is None or buf.dtype != dt or buf.size < n:
            grown = int(1.25 * buf.size) if buf is not None and buf.dtype == dt else 0
            # the old buffer goes first, so growing never holds both
            self.buffers.pop(name, None)
            buf = self.buffers[name] = np.empty(max(n, grown), dt)
        return buf[:n]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())


_THREAD = threading.local()
# Other per-thread buffers a build keeps between tasks (Blosc's destinations), dropped with the
# scratch: methods that drop the calling thread's, held weakly (their owners may go first).
_RELEASERS: list[weakref.WeakMethod[Callable[[], None]]] = []


def thread_scratch() -> Scratch:
    """This thread's scratch (a pack task's reads and chunks; freed when the thread ends)."""
    scratch = getattr(_THREAD, "scratch", None)
    if scratch is None:
        scratch = _THREAD.scratch = Scratch()
    return scratch


def on_release(drop: Callable[[], None]) -> None:
    """Have `release_thread_buffers` also call ``drop``, a bound method that frees the calling
    thread's own buffers of some kind, while its object lives."""
    _RELEASERS[:] = [r for r in _RELEASERS if r() is not None]
    _RELEASERS.append(weakref.WeakMethod(drop))  # type: ignore[arg-type]


def release_thread_buffers() -> None:
    """Drop the calling thread's buffers. A build calls it when its tasks are done: a build run
    inline (one job, or one task) runs them on the caller's thread, and a process that goes on
    after `build()` (a notebook, a trainer) should not keep a pack's working set."""
    scratch = getattr(_THREAD, "scratch", None)
    if scratch is not None:
        scratch.buffers.clear()
        scratch.owner = None
    for ref in list(_RELEASERS):
        drop = ref()
        if drop is not None:
            drop()
