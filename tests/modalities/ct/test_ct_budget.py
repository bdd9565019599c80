"""Invariants of voxel-budget batching (loaders.epoch.budget), for any costs, budget, world size and
epoch."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.epoch import budget, order

SETTINGS = settings(max_examples=150, deadline=None)
costs_st = st.lists(st.integers(0, 60), min_size=0, max_size=40)


def batches_of(bounds: np.ndarray, n: int) -> list[np.ndarray]:
    return [budget.batch_positions(bounds, n, j) for j in range(bounds.size - 1)]


@SETTINGS
@given(costs=costs_st, extra=st.integers(0, 100), world=st.integers(1, 6), pad=st.booleans())
def test_budget_ranks_and_coverage(costs: list[int], extra: int, world: int, pad: bool) -> None:
    cap = max(costs, default=0) + extra + 1
    c = np.asarray(costs, dtype=np.int64)
    n = c.size
    b = budget.budget_bounds(c, cap, world, pad)
    assert b[0] == 0 and np.all(np.diff(b) > 0)  # no empty batch
    assert (b.size - 1) % world == 0
    per_rank = [budget.rank_batches(b, r, world) for r in range(world)]
    assert len({p.size for p in per_rank}) == 1  # equal batch counts on every rank
    seen = Counter()
    for r in range(world):
        for pos in batches_of(per_rank[r], n):
            assert c[pos].sum() <= cap  # the budget holds for every batch
            seen.update(pos.tolist())
    greedy = budget.greedy_bounds(c, cap).size - 1
    if -(-greedy // world) * world <= n:  # the usual case: every unit exactly once
        assert sorted(seen.elements()) == list(range(n))
    elif pad:  # fewer units than steps the ranks need: all units, some repeated one per batch
        assert set(seen) == set(range(n))
        assert all(np.diff(b) == 1)
    else:  # drop: a tail is left out, nothing is repeated
        assert max(seen.values(), default=1) == 1
        assert n - len(seen) <= n - (greedy // world) * world


@SETTINGS
@given(costs=costs_st, extra=st.integers(0, 50), world=st.integers(1, 6))
def test_ranks_disjoint_and_contiguous_in_order(costs: list[int], extra: int, world: int) -> None:
    cap = max(costs, default=0) + extra + 1
    b = budget.budget_bounds(costs, cap, world, pad=False)
    units = [
        p
        for r in range(world)
        for pos in batches_of(budget.rank_batches(b, r, world), len(costs))
        for p in pos.tolist()
    ]
    assert len(units) == len(set(units))
    assert units == sorted(
        units
    )  # shuffle=False order: rank 0 first, each batch a run of the order


@SETTINGS
@given(costs=costs_st, extra=st.integers(0, 50))
def test_greedy_is_maximal(costs: list[int], extra: int) -> None:
    """Each greedy batch could not take the next unit: no budget is wasted by the first pass."""
    c = np.asarray(costs, dtype=np.int64)
    cap = max(costs, default=0) + extra + 1
    g = budget.greedy_bounds(c, cap)
    for lo, hi in zip(g[:-1], g[1:], strict=True):
        assert c[lo:hi].sum() <= cap
        if hi < c.size:
            assert c[lo : hi + 1].sum() > cap


@SETTINGS
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 4),
    window=st.integers(1, 3),
    world=st.integers(1, 4),
    shuffle=st.booleans(),
)
def test_epoch_plan_is_deterministic_and_covers_every_volume(
    counts: list[int], seed: int, epoch: int, window: int, world: int, shuffle: bool
) -> None:
    rng = np.random.default_rng(len(counts))
    unit_costs = [rng.integers(1, 100, size=n) for n in counts]
    costs = budget.epoch_costs(counts, unit_costs, seed, epoch, window, shuffle)
    again = budget.epoch_costs(counts, unit_costs, seed, epoch, window, shuffle)
    np.testing.assert_array_equal(costs, again)
    shard_idx, local_idx = order.global_units(counts, seed, epoch, window, 0, sum(counts), shuffle)
    expect = [int(unit_costs[s][u]) for s, u in zip(shard_idx, local_idx, strict=True)]
    assert costs.tolist() == expect
    if not shuffle:
        assert costs.tolist() == [int(x) for u in unit_costs for x in u]
    b = budget.budget_bounds(costs, 150, world, pad=True)
    np.testing.assert_array_equal(b, budget.budget_bounds(again, 150, world, pad=True))


def test_split_balances_and_bad_inputs() -> None:
    b = budget.budget_bounds([10, 10, 10, 10], 100, world=2)
    assert b.tolist() == [0, 2, 4]  # one greedy batch of 40, split at its midpoint
    assert budget.budget_bounds([], 5, 3).tolist() == [0]
    assert budget.budget_bounds([1, 2], 5, 3, pad=True).tolist() == [0, 1, 2, 3]  # unit 0 repeated
    assert budget.budget_bounds([1, 2], 5, 3, pad=False).tolist() == [0]
    with pytest.raises(ValueError, match="more than the batch budget 5"):
        budget.budget_bounds([3, 6], 5)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        budget.budget_bounds([1], 0)
    with pytest.raises(ValueError, match="do not divide"):
        budget.rank_batches(np.array([0, 1, 2, 3]), 0, 2)
    with pytest.raises(ValueError, match="one cost per unit"):
        budget.epoch_costs([2], [np.array([1])], 0, 0, 1)
