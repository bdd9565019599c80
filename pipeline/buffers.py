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

    A view is valid until the next `get` of the same name. A user that keeps views across calls
    `claim`s their names and asks `holds` before reusing them: a `get` of a claimed name drops
    the claim (`ShardRows` keeps its last gathered chunk that way, while reads into the staging
    buffers and Blosc's destinations leave it alone).
    Buffers are typed, not bytes viewed as a type: scipy copies an index or data array whose base
    is over twice its size (`_prune_array`, on every CSR it checks), and a byte buffer's view is
    always that."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}
        self.claims: dict[str, object] = {}

    def get(self, name: str, dtype: np.dtype | type, n: int) -> np.ndarray:
        self.claims.pop(name, None)
        dt = np.dtype(dtype)
        buf = self.buffers.get(name)
        if buf is None or buf.dtype != dt or buf.size < n:
            grown = int(1.25 * buf.size) if buf is not None and buf.dtype == dt else 0
            # the old buffer goes first, so growing never holds both
            self.buffers.pop(name, None)
            buf = self.buffers[name] = np.empty(max(n, grown), dt)
        return buf[:n]

    def claim(self, owner: object, names: list[str]) -> None:
        """``owner`` keeps views of these buffers until one of them is handed out again."""
        self.claims.update(dict.fromkeys(names, owner))

    def holds(self, owner: object, names: list[str]) -> bool:
        """Whether ``owner``'s views of these buffers are still what it left in them."""
        return all(self.claims.get(n) is owner for n in names)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())


_THREAD = threading.local()


def thread_scratch() -> Scratch:
    """This thread's scratch (a pack task's reads, chunks and Blosc's destinations; freed when
    the thread ends)."""
    scratch = getattr(_THREAD, "scratch", None)
    if scratch is None:
        scratch = _THREAD.scratch = Scratch()
    return scratch


def release_thread_buffers() -> None:
    """Drop the calling thread's buffers. A build calls it when its tasks are done: a build run
    inline (one job, or one task) runs them on the caller's thread, and a process that goes on
    after `build()` (a notebook, a trainer) should not keep a pack's working set."""
    scratch = getattr(_THREAD, "scratch", None)
    if scratch is not None:
        scratch.buffers.clear()
        scratch.claims.clear()
