"""Handing freed memory back to the OS (glibc), so the build's peak RSS follows what it holds, not
what it held once: the plan's temporaries before the pack, each pack task's buffers after it.
No-ops off glibc."""

from __future__ import annotations

import ctypes
from typing import Any

_LIBC: list[Any] = []  # [the C library], or [None] off glibc; loaded on first use


def _libc() -> Any:
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None)
            _LIBC.append(
                libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
            )
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]


def release_freed_memory() -> None:
    """Make glibc return big freed blocks to the OS at once (a fixed 1 MiB mmap threshold).

    By default glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB),
    after which chunk-sized numpy temporaries are carved from per-thread heaps that are rarely
    trimmed: peak RSS then grows with every task a thread runs (+150 MiB at 400k cells, --jobs
    2). The price is a fresh mmap per big temporary, hence the pack's reused buffers
    (`pipeline.buffers`), and the plan runs before this is set.
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
        libc.malloc_trim(0)  # and hand back what the plan's temporaries left in the heap


def bound_heaps(nbytes: int = 8 << 20) -> None:
    """While the plan runs beside pack tasks (`pipeline.pipelined`): blocks of ``nbytes`` and more
    are mapped (returned at free), and a thread's heap keeps at most ``nbytes`` free at its top.

    Under glibc's dynamic threshold (each freed mapped block raises it, up to 32 MiB, and the trim
    threshold to twice that) the pack's chunk buffers come from its thread's heap, where they
    fragment it, and a thread heap's free top goes back to the OS only past the trim threshold
    (malloc_trim cuts the main heap's top, no thread's): at 2M cells the pack thread's and the
    planner's heaps held ~50 and ~60 MiB beside the mapped blocks. 8 MiB keeps the plan's per-cell
    temporaries and a shard's slot tables (up to ~8 MB) in its heap: 4 MiB cost the plan ~20%
    more CPU (fresh pages for every shard's tables), 1 MiB ~50%. The 1 MiB threshold
    (`release_freed_memory`) follows once the plan is done.
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, nbytes)  # M_TRIM_THRESHOLD


def trim_heap() -> None:
    """Return the free pages inside glibc's heaps (every thread's arena) to the OS, after a pack
    task.

    Blocks under the mmap threshold (HDF5's and the codecs' buffers, small arrays) fragment the
    per-thread arenas; nothing hands their free pages back but malloc_trim, so without it a
    build's RSS crept up with the number of tasks it ran: +86 MiB by the end of a 2M-cell build
    (56 read and 56 pack tasks), all of it free (docs/benchmarks/ANALYSIS.md, 4b). A trim costs well
    under a millisecond per task here.
    """
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
