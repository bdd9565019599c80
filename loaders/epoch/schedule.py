"""Which window each batch reads, and which window a worker should decode next.

Pure bookkeeping over :mod:`loaders.epoch.order` (no I/O, no threads): :func:`batch_segments` turns a
batch's global positions into runs inside one window each, and :class:`WindowSchedule` walks a
worker's batches telling the dataset which windows the current batch needs and which one comes
next (to decode meanwhile).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

Segment = tuple[int, int, int]  # (window, first position in it, end position)
Plan = tuple[list[Segment], list[int]]  # (segments in batch order, windows in order of first use)
MAX_LOOKAHEAD = 4096  # batches planned ahead while looking for the next window to decode


def batch_segments(
    bounds: Sequence[int], per_rank: int, rank: int, batch_size: int, j: int
) -> Plan:
    """Batch ``j`` of ``rank`` as runs of window positions (``bounds``: window starts, then the
    total).

    The batch's global positions (:func:`loaders.epoch.order.batch_positions`) are ``(k + rank *
    per_rank) % N`` for rank positions ``k``: contiguous but for the wrap (padding) and window
    ends, so a batch is one segment in the common case and never more than a few."""
    total = int(bounds[-1])
    lo = j * batch_size
    return _walk(
        bounds, (lo + rank * per_rank) % max(total, 1), min(lo + batch_size, per_rank) - lo
    )


def range_segments(bounds: Sequence[int], start: int, stop: int) -> Plan:
    """Global positions ``[start, stop)`` (wrapping modulo the total: padding) as runs inside one
    window each: a batch of variable size, as :mod:`loaders.epoch.budget` plans them."""
    return _walk(bounds, start % max(int(bounds[-1]), 1), stop - start)


def runs_segments(bounds: Sequence[int], runs: Sequence[tuple[int, int]]) -> Plan:
    """Runs ``(first global position, length)`` of one batch, in order (a physical rank's slice of
    a global batch, :func:`loaders.epoch.elastic.slice_runs`), as runs inside one window each."""
    if len(runs) == 1:  # the common case: the rank reads one canonical partition
        return _walk(bounds, runs[0][0] % max(int(bounds[-1]), 1), runs[0][1])
    segments: list[Segment] = []
    for first, n in runs:
        segments += _walk(bounds, first % max(int(bounds[-1]), 1), n)[0]
    return segments, list(dict.fromkeys(w for w, _, _ in segments))


def _walk(bounds: Sequence[int], g: int, left: int) -> Plan:
    """``left`` positions from global position ``g`` on, cut at window ends (and wrapped at the
    total)."""
    total = int(bounds[-1])
    segments: list[Segment] = []
    while left > 0:
        w = bisect.bisect_right(bounds, g) - 1
        take = min(left, int(bounds[w + 1]) - g)
        segments.append((w, g - int(bounds[w]), g - int(bounds[w]) + take))
        left, g = left - take, (g + take) % total
    return segments, list(dict.fromkeys(w for w, _, _ in segments))


class WindowSchedule:
    """A worker's batch plans, with the next window it will touch once the current batch's are in
    use."""

    def __init__(self, plans: Iterable[Plan]) -> None:
        self._plans: Iterator[Plan] = iter(plans)
        self._pending: deque[Plan] = deque()
        self._upcoming: deque[int] = deque()  # windows in order of first use, not yet in use
        self._seen: set[int] = set()
        self._exhausted = False

    def _look_ahead(self) -> None:
        while (
            not self._exhausted
            and (not self._pending or not self._upcoming)
            and len(self._pending) < MAX_LOOKAHEAD
        ):
            p = next(self._plans, None)
            if p is None:
                self._exhausted = True
                break
            self._pending.append(p)
            for w in p[1]:
                if w not in self._seen:
                    self._seen.add(w)
                    self._upcoming.append(w)

    def next_plan(self) -> Plan | None:
        """The next batch's plan (``None`` at the end); afterwards :attr:`next_window` is the one
        after it."""
        self._look_ahead()
        if not self._pending:
            return None
        plan = self._pending.popleft()
        while self._upcoming and self._upcoming[0] in plan[1]:
            self._upcoming.popleft()  # in use now (not merely loaded: a prefetch must be kept)
        self._look_ahead()
        return plan

    @property
    def next_window(self) -> int | None:
        """The first window not used so far; ``None`` when the current batch's windows are the last
        ones."""
        return self._upcoming[0] if self._upcoming else None
