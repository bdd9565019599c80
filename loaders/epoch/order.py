"""The sample order of an epoch, as pure numpy functions (no torch, no I/O).

Everything a loader needs to agree on across ranks, workers and restarts is computed here from
``(counts, seed, epoch)`` alone, so the order can be tested exhaustively and reproduced anywhere.

Vocabulary:

* a *unit* is what an epoch iterates (a primary cell, a pair row or a sentence row);
  ``counts[s]`` is the number of units in shard ``s`` (shards in index order);
* shards are permuted per epoch and cut into *windows* of ``window`` consecutive shards: a window
  is the shuffle buffer (the loader decodes its shards together and mixes their units);
* the *global order* is the concatenation of the windows, each one's units shuffled. It does not
  depend on the world size, the number of workers or the batch size;
* rank ``r`` of ``world`` takes the contiguous slice ``[r*n, (r+1)*n)`` of global positions (on
  another world, a resumed epoch keeps these slices as *canonical partitions* and each physical
  rank reads its share of every step: :mod:`loaders.epoch.elastic`);
  batch ``j`` of a rank covers its positions ``[j*B, (j+1)*B)``; worker ``w`` of ``W`` takes runs of
  ``group`` consecutive batches, runs ``w, w + W, ...`` from ``start``, so the DataLoader's
  round-robin over
  workers gives back the rank's batch sequence exactly (``start`` > 0 resumes mid-epoch).

Memory: only the windows a request overlaps are materialised; nothing is O(total units) except
per-shard arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

WindowUnits = tuple[
    np.ndarray, np.ndarray
]  # (shard_idx int64[], local_idx int64[]) of one window, in order


def _counts(counts: np.ndarray | list[int]) -> np.ndarray:
    c = np.asarray(counts, dtype=np.int64).reshape(-1)
    if c.size and c.min() < 0:
        raise ValueError("unit counts must be >= 0")
    return c


def _check(seed: int, epoch: int, window: int) -> None:
    # default_rng needs non-negative entropy; a negative seed would raise deep inside numpy.
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0 (got seed={seed}, epoch={epoch})")
    if window < 1:
        raise ValueError(f"window must be >= 1 shard (got {window})")


def shard_permutation(n_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shard order: which shards are decoded together, and when."""
    return np.random.default_rng([seed, epoch, 0]).permutation(n_shards).astype(np.int64)


def window_count(n_shards: int, window: int) -> int:
    """Windows an epoch of ``n_shards`` shards is decoded in (the last may be short)."""
    return -(-n_shards // window)


def window_bounds(
    counts: np.ndarray | list[int], seed: int, epoch: int, window: int, shuffle: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``(shard_order, window_starts)``: window ``w`` holds shards
    ``shard_order[w*window:(w+1)*window]`` and global positions ``[window_starts[w],
    window_starts[w+1])``; ``window_starts[-1]`` is the total.

    ``shuffle=False`` keeps shards in index order (same windows, used only for decode grouping).
    """
    _check(seed, epoch, window)
    c = _counts(counts)
    order = shard_permutation(c.size, seed, epoch) if shuffle else np.arange(c.size, dtype=np.int64)
    n_windows = window_count(c.size, window)
    per_window = (
        np.add.reduceat(c[order], np.arange(0, c.size, window)) if c.size else np.zeros(0, np.int64)
    )
    starts = np.zeros(n_windows + 1, dtype=np.int64)
    np.cumsum(per_window, out=starts[1:])
    return order, starts


def window_shards(shard_order: np.ndarray, window: int, w: int) -> np.ndarray:
    """Shards of window ``w`` in the order their units are concatenated."""
    return shard_order[w * window : (w + 1) * window]


def window_units(
    counts: np.ndarray | list[int], seed: int, epoch: int, window: int, w: int, shuffle: bool = True
) -> WindowUnits:
    """All units of window ``w`` in global order: its shards' units concatenated, then shuffled."""
    c = _counts(counts)
    order, _ = window_bounds(c, seed, epoch, window, shuffle)
    shards = window_shards(order, window, w)
    n = c[shards]
    total = int(n.sum())
    shard_idx = np.repeat(shards, n)
    offsets = np.zeros(shards.size, dtype=np.int64)
    np.cumsum(n[:-1], out=offsets[1:])
    local_idx = np.arange(total, dtype=np.int64) - np.repeat(offsets, n)
    if shuffle and total > 1:
        perm = np.random.default_rng([seed, epoch, 1, w]).permutation(total)
        shard_idx, local_idx = shard_idx[perm], local_idx[perm]
    return shard_idx, local_idx


def units_at(
    counts: np.ndarray | list[int],
    seed: int,
    epoch: int,
    window: int,
    positions: np.ndarray,
    shuffle: bool = True,
    get_window: Callable[[int], WindowUnits] | None = None,
    starts: np.ndarray | None = None,
) -> WindowUnits:
    """Units at arbitrary global positions (each in ``[0, N)``).

    ``get_window(w)`` may serve ``window_units(..., w)`` from a cache and ``starts`` may pass
    ``window_bounds(...)[1]``: a loader asks for hundreds of batches per epoch and should neither
    re-shuffle a window nor re-seed a generator for each.
    """
    c = _counts(counts)
    pos = np.asarray(positions, dtype=np.int64).reshape(-1)
    if starts is None:
        _, starts = window_bounds(c, seed, epoch, window, shuffle)
    total = int(starts[-1])
    if pos.size and (pos.min() < 0 or pos.max() >= total):
        raise ValueError(f"positions outside [0, {total})")
    shard_idx = np.empty(pos.size, dtype=np.int64)
    local_idx = np.empty(pos.size, dtype=np.int64)
    if not pos.size:
        return shard_idx, local_idx
    win = np.searchsorted(starts, pos, side="right") - 1
    fetch = get_window or (lambda w: window_units(c, seed, epoch, window, w, shuffle))
    for w in np.unique(
        win
    ).tolist():  # a batch touches one window, rarely two: a loop over windows, not units
        sel = np.flatnonzero(win == w)
        s, loc = fetch(int(w))
        rel = pos[sel] - starts[w]
        shard_idx[sel] = s[rel]
        local_idx[sel] = loc[rel]
    return shard_idx, local_idx


def global_units(
    counts: np.ndarray | list[int],
    seed: int,
    epoch: int,
    window: int,
    start: int,
    stop: int,
    shuffle: bool = True,
) -> WindowUnits:
    """Units at global positions ``[start, stop)``, materialising only the overlapping windows."""
    return units_at(counts, seed, epoch, window, np.arange(start, stop, dtype=np.int64), shuffle)


def rank_size(n_units: int, world: int, pad: bool) -> int:
    """Positions per rank: ceil (padding by repetition) or floor (dropping the tail). Equal on every
    rank."""
    if world < 1:
        raise ValueError(f"world size must be >= 1 (got {world})")
    if n_units <= 0:
        return 0
    return -(-n_units // world) if pad else n_units // world


def rank_positions(
    n_units: int, rank: int, world: int, pad: bool, start: int, stop: int
) -> np.ndarray:
    """Global positions of rank positions ``[start, stop)``; positions past the end wrap modulo N."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside [0, {world})")
    n = rank_size(n_units, world, pad)
    start, stop = max(0, start), min(stop, n)
    if stop <= start:
        return np.zeros(0, dtype=np.int64)
    return (np.arange(start, stop, dtype=np.int64) + rank * n) % n_units


def num_batches(n: int, batch_size: int, drop_last: bool) -> int:
    """Batches from ``n`` rank positions; the last one is partial unless ``drop_last``."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    return n // batch_size if drop_last else -(-n // batch_size)


def batch_positions(
    n_units: int, rank: int, world: int, batch_size: int, j: int, pad: bool
) -> np.ndarray:
    """Global positions of batch ``j`` of ``rank``."""
    return rank_positions(n_units, rank, world, pad, j * batch_size, (j + 1) * batch_size)


@dataclass(frozen=True)
class WorkerRuns(Sequence[range]):
    """The runs of consecutive batch ids one DataLoader worker ships, one item each; lazy (O(1)
    memory)."""

    firsts: range  # each run's first batch id
    group: int
    n_batches: int

    def __len__(self) -> int:
        return len(self.firsts)

    @overload
    def __getitem__(self, i: int) -> range: ...
    @overload
    def __getitem__(self, i: slice) -> list[range]: ...

    def __getitem__(self, i: int | slice) -> range | list[range]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        a = self.firsts[i]
        return range(a, min(a + self.group, self.n_batches))

    def batches(self) -> Iterator[int]:
        """The worker's batch ids, in the order it makes them."""
        for run in self:
            yield from run


def worker_runs(
    n_batches: int, worker: int, num_workers: int, start: int = 0, group: int = 1
) -> WorkerRuns:
    """The runs of batches worker ``worker`` of ``num_workers`` ships (0 workers: the main process
    does all).

    From ``start`` on, batches are cut into runs of ``group`` and dealt round-robin from worker
    0: worker ``w`` takes runs ``w, w + W, ...``. The DataLoader asks workers in that same order,
    so merging their items back reproduces the rank's batch sequence from ``start`` on, for any
    ``W`` and ``group``.
    """
    w_total, group, start = max(1, num_workers), max(1, int(group)), max(0, int(start))
    if not 0 <= worker < w_total:
        raise ValueError(f"worker {worker} outside [0, {w_total})")
    return WorkerRuns(range(start + worker * group, n_batches, w_total * group), group, n_batches)


def worker_batches(
    n_batches: int, worker: int, num_workers: int, start: int = 0, group: int = 1
) -> list[int]:
    """Batch ids of one worker, in order (tests and small counts; the loader iterates
    :func:`worker_runs`)."""
    return list(worker_runs(n_batches, worker, num_workers, start, group).batches())


def batch_units(
    counts: np.ndarray | list[int],
    seed: int,
    epoch: int,
    window: int,
    rank: int,
    world: int,
    batch_size: int,
    j: int,
    pad: bool,
    shuffle: bool = True,
    get_window: Callable[[int], WindowUnits] | None = None,
) -> WindowUnits:
    """``(shard_idx, local_idx)`` of batch ``j`` of ``rank``; ``shuffle=False`` is the natural
    order."""
    c = _counts(counts)
    pos = batch_positions(int(c.sum()), rank, world, batch_size, j, pad)
    return units_at(c, seed, epoch, window, pos, shuffle, get_window)
