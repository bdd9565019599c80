"""The epoch's batches on any world size, as pure numpy functions of a *canonical partition*.

Why: a rank's batches used to be a contiguous slice of the global order that depended on the world
size, so a state saved on N ranks meant nothing on M. Here the batches of an epoch are defined
once, by ``K`` canonical partitions that do not depend on the physical world, and every physical
world reads them in the same *global batch* sequence; a resume on another world continues that
sequence where it stopped.

Fixed-size batches (``G`` units a step over all ranks, ``G = world * batch_size``):

* canonical partition ``k`` of ``K`` is what rank ``k`` of a ``K``-rank world took before:
  global positions ``[k*n, (k+1)*n)``, ``n = order.rank_size(N, K, pad)`` (wrapping mod ``N``);
  its batch ``g`` is its positions ``[g*c, (g+1)*c)`` with ``c = G / K`` (``K`` divides ``G``);
* global batch ``g`` is partition 0's batch ``g``, then partition 1's, ... (``K*c = G`` units, the
  last one shorter); there are ``T = num_batches(n, c, drop_last)`` of them, whatever the world;
* physical rank ``r`` of ``M`` (``M * b = G``) takes the slice ``[r*b, (r+1)*b)`` of global batch
  ``g``; a shorter last global batch (``L < G`` units) is cut into ``M`` equal slices of
  ``ceil(L/M)``, wrapping to its start (a few units repeat), so every rank has a batch.

With ``K = M`` rank ``r`` reads exactly partition ``r``: the order every run had before elastic
resume. Every step serves whole global batches, so a resume after ``j`` steps on any ``M`` serves
global batches ``j..T-1``: every unit not yet served, repeats fewer than one global batch (``G``),
none when ``N`` is a multiple of ``G``. When ``M`` divides ``K`` a rank reads only its ``K/M``
partitions' windows; otherwise at most ``K/M + 1`` partitions.

Budget batches (:mod:`loaders.epoch.budget`, a voxel budget per batch): the ``K``-partition plan has
``K*T`` batches, partition ``k`` owning ``[k*T, (k+1)*T)``. Step-major, canonical batch ``i`` of
the flat sequence is partition ``i mod K``'s batch ``i // K``. A run that starts at flat offset
``o`` on ``M`` ranks gives rank ``r`` flat batches ``o + r, o + r + M, ...``; the last step wraps to
``o`` (repeating at most ``M - 1`` whole batches, each within the budget). With ``K = M`` and
``o = 0`` that is today's plan; the per-rank count, ``ceil((K*T - o) / M)``, changes with ``M``.
"""

from __future__ import annotations

import numpy as np

from loaders.epoch import order

Run = tuple[int, int]  # (first global position, length): positions first, first + 1, ... mod N


def check_partitions(partitions: int, global_batch: int) -> None:
    """``K`` canonical partitions must split the global batch evenly (``c = G / K`` per step)."""
    if partitions < 1 or global_batch < 1 or global_batch % partitions:
        raise ValueError(
            f"partitions={partitions} must be >= 1 and divide the global batch ({global_batch} = "
            "world_size x batch_size): each canonical partition takes global_batch / partitions "
            "units a step"
        )


def global_batches(
    n_units: int, partitions: int, global_batch: int, pad: bool, drop_last: bool
) -> int:
    """``T``: the epoch's steps (equal on every rank, whatever the physical world)."""
    check_partitions(partitions, global_batch)
    n = order.rank_size(n_units, partitions, pad)
    return order.num_batches(n, global_batch // partitions, drop_last)


def slice_runs(
    n_units: int,
    partitions: int,
    global_batch: int,
    world: int,
    rank: int,
    g: int,
    pad: bool,
) -> list[Run]:
    """Physical ``rank``'s share of global batch ``g`` as runs of consecutive global positions (a
    run ends at a partition's end; the caller wraps positions mod ``N``)."""
    if world < 1 or global_batch % world:
        raise ValueError(f"world size {world} does not divide the global batch {global_batch}")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside [0, {world})")
    n = order.rank_size(n_units, partitions, pad)
    c = global_batch // partitions
    lo = g * c
    ln = min(c, n - lo)  # this step's batch length in every partition
    if ln <= 0:
        return []
    total = partitions * ln
    share = global_batch // world if total == global_batch else -(-total // world)
    runs: list[Run] = []
    q, end = rank * share, rank * share + share
    while q < end:  # at most K/M + 2 pieces: one per partition touched (and a wrap)
        qq = q % total
        k, off = divmod(qq, ln)
        take = min(end - q, ln - off)
        runs.append((k * n + lo + off, take))
        q += take
    return runs


def positions(runs: list[Run], n_units: int) -> np.ndarray:
    """The global positions of ``runs`` (wrapped mod ``N``)."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    pos = np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in runs])
    return pos % max(n_units, 1)


def batch_positions(
    n_units: int,
    partitions: int,
    global_batch: int,
    world: int,
    rank: int,
    g: int,
    pad: bool,
) -> np.ndarray:
    """Global positions of physical ``rank``'s batch at step ``g``."""
    runs = slice_runs(n_units, partitions, global_batch, world, rank, g, pad)
    return positions(runs, n_units)


def budget_steps(n_batches: int, world: int, offset: int) -> int:
    """Per-rank batches of a budget plan of ``n_batches`` run on ``world`` ranks from flat
    ``offset``."""
    left = max(0, n_batches - offset)
    return -(-left // world)


def budget_rank_ids(
    n_batches: int, partitions: int, world: int, rank: int, offset: int
) -> np.ndarray:
    """Plan batch ids (into :func:`loaders.epoch.budget.budget_bounds`' bounds) of ``rank``'s batches,
    in order: flat batches ``offset + rank + t*world``, the last step wrapping to ``offset``."""
    if n_batches % partitions:
        raise ValueError(f"{n_batches} budget batches do not divide among {partitions} partitions")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside [0, {world})")
    left = max(0, n_batches - offset)
    steps = budget_steps(n_batches, world, offset)
    flat = offset + (np.arange(steps, dtype=np.int64) * world + rank) % max(left, 1)
    per = n_batches // partitions
    return (flat % partitions) * per + flat // partitions
