"""Batches by cost budget (e.g. voxels per batch) instead of by count, as pure numpy functions.

CT volumes differ ten-fold in points, so a fixed ``batch_size`` either wastes most of a GPU's
memory or overflows it on the largest volumes. Here a batch takes as many units as fit in
``budget``. The epoch's global order is the one :mod:`loaders.epoch.order` defines (shards permuted per
epoch, windows shuffled); this module only cuts that order into *variable* batches, so shuffling,
windows and resume work as for fixed-size batches.

A plan is ``bounds``: int64 ``[K + 1]`` global positions, ``bounds[0] = 0``, strictly increasing;
batch ``k`` covers positions ``[bounds[k], bounds[k+1])``, positions ``>= N`` wrap modulo ``N``
(padding repeats units from the start of the order, as :func:`loaders.epoch.order.rank_positions`
does). Guarantees, for any input:

* every batch's cost is ``<= budget`` (a unit costing more than the budget is an error, raised up
front);
* ``K`` is a multiple of ``world``: rank ``r`` takes batches ``[r*T, (r+1)*T)`` with ``T = K /
world``, so
  every rank runs the same number of steps and DDP never hangs;
* every unit is in exactly one batch of the epoch whenever there are at least ``K`` units (always,
except
  for datasets with fewer units than ranks x batches: then ``pad`` repeats a few units, or without
  ``pad``
  the last batches are dropped, as ``drop_last`` does for count batches);
* a function of ``(costs in order, budget, world, pad)`` only: the same on every rank and worker,
and for
  any number of workers.

How: greedy first-fit along the order (a batch grows while it fits), then the costliest batches
are split in two at their cost midpoint until the count is a multiple of ``world`` (fewer than
``world`` splits).
"""

from __future__ import annotations

import numpy as np

from loaders.epoch import order


def _costs(costs: np.ndarray | list[int], budget: int) -> np.ndarray:
    c = np.asarray(costs, dtype=np.int64).reshape(-1)
    if budget < 1:
        raise ValueError(f"the batch budget must be >= 1 (got {budget})")
    if c.size and c.min() < 0:
        raise ValueError("unit costs must be >= 0")
    if c.size and c.max() > budget:
        raise ValueError(
            f"a unit costs {int(c.max())}, more than the batch budget {budget}: raise the budget "
            f"(max_points_per_batch) to at least {int(c.max())}, or rebuild with a smaller max_points"
        )
    return c


def greedy_bounds(costs: np.ndarray | list[int], budget: int) -> np.ndarray:
    """Sequential first-fit: each batch takes the longest run of the following units whose total
    fits."""
    c = _costs(costs, budget)
    cum = np.zeros(c.size + 1, dtype=np.int64)
    np.cumsum(c, out=cum[1:])
    bounds, pos = [0], 0
    while pos < c.size:  # one searchsorted per batch, not a loop over units
        pos = max(pos + 1, int(np.searchsorted(cum, cum[pos] + budget, side="right")) - 1)
        bounds.append(pos)
    return np.asarray(bounds, dtype=np.int64)


def split_bounds(bounds: np.ndarray, costs: np.ndarray | list[int], k: int) -> np.ndarray:
    """Split batches until there are ``k``: each time the costliest batch of >= 2 units (the
    earliest on ties) is cut where its cost is closest to halved. Raises if ``k`` exceeds the
    number of units."""
    c = np.asarray(costs, dtype=np.int64).reshape(-1)
    b = np.asarray(bounds, dtype=np.int64)
    if k < b.size - 1 or k > c.size:
        raise ValueError(f"cannot split {b.size - 1} batches of {c.size} units into {k}")
    cum = np.zeros(c.size + 1, dtype=np.int64)
    np.cumsum(c, out=cum[1:])
    b = b.tolist()
    while len(b) - 1 < k:
        lo, hi = np.asarray(b[:-1]), np.asarray(b[1:])
        cost = np.where(hi - lo >= 2, cum[hi] - cum[lo], -1)
        i = int(np.argmax(cost))  # first maximum: deterministic
        a, z = b[i], b[i + 1]
        inner = np.arange(a + 1, z)  # cut points that leave both halves non-empty
        cut = int(inner[np.argmin(np.abs(2 * cum[inner] - cum[a] - cum[z]))])
        b.insert(i + 1, cut)
    return np.asarray(b, dtype=np.int64)


def budget_bounds(
    costs: np.ndarray | list[int], budget: int, world: int = 1, pad: bool = True
) -> np.ndarray:
    """The epoch's batch bounds for units of ``costs`` (in global order); see the module docstring."""
    if world < 1:
        raise ValueError(f"world size must be >= 1 (got {world})")
    c = _costs(costs, budget)
    n = c.size
    greedy = greedy_bounds(c, budget)
    n_batches = greedy.size - 1
    k = -(-n_batches // world) * world
    if k <= n:
        return split_bounds(greedy, c, k)
    if (
        pad
    ):  # fewer units than batches the ranks need: one unit a batch, then repeats from the start
        return np.arange(k + 1, dtype=np.int64)
    return greedy[: (n_batches // world) * world + 1]


def rank_batches(bounds: np.ndarray, rank: int, world: int) -> np.ndarray:
    """The bounds of ``rank``'s batches (``T + 1`` entries): batches ``[rank*T, (rank+1)*T)``."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside [0, {world})")
    k = int(np.asarray(bounds).size) - 1
    if k % world:
        raise ValueError(f"{k} batches do not divide among {world} ranks")
    t = k // world
    return np.asarray(bounds[rank * t : (rank + 1) * t + 1], dtype=np.int64)


def batch_positions(bounds: np.ndarray, n_units: int, j: int) -> np.ndarray:
    """Global positions of batch ``j`` of ``bounds`` (a rank's bounds or the whole epoch's), wrapped
    mod N."""
    return np.arange(int(bounds[j]), int(bounds[j + 1]), dtype=np.int64) % max(n_units, 1)


def epoch_costs(
    counts: np.ndarray | list[int],
    unit_costs: list[np.ndarray],
    seed: int,
    epoch: int,
    window: int,
    shuffle: bool = True,
) -> np.ndarray:
    """Costs of all units in the epoch's global order (``unit_costs[s]``: per-unit costs of shard
    ``s``, as the index lists them). O(units): fine for volumes, which number thousands, not
    millions."""
    c = np.asarray(counts, dtype=np.int64).reshape(-1)
    if len(unit_costs) != c.size or any(
        np.asarray(u).size != n for u, n in zip(unit_costs, c.tolist(), strict=True)
    ):
        raise ValueError("unit_costs must list one cost per unit of every shard")
    flat = (
        np.concatenate([np.asarray(u, dtype=np.int64).reshape(-1) for u in unit_costs])
        if c.size
        else np.zeros(0, np.int64)
    )
    first = np.zeros(c.size + 1, dtype=np.int64)
    np.cumsum(c, out=first[1:])
    shard_idx, local_idx = order.global_units(c, seed, epoch, window, 0, int(first[-1]), shuffle)
    return flat[first[shard_idx] + local_idx]
