"""Properties of the elastic layout (loaders.epoch.elastic): the epoch's batches as a pure function of
(seed, epoch, canonical partitions), the same as before when the world is the partition count, and
a resume on any other world serving every unit not yet served."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.epoch import budget, elastic, order, resume
from loaders.epoch.schedule import batch_segments, runs_segments

SETTINGS = settings(max_examples=80, deadline=None)
DIVISORS = {g: [d for d in range(1, g + 1) if g % d == 0] for g in range(1, 25)}


@st.composite
def layouts(draw: st.DrawFn) -> tuple[int, int, list[int], bool, bool]:
    """(N units, global batch G, worlds dividing G: the first is K, the rest resume), pad,
    drop_last."""
    g = draw(st.integers(1, 24))
    worlds = draw(st.lists(st.sampled_from(DIVISORS[g]), min_size=1, max_size=4))
    return draw(st.integers(0, 120)), g, worlds, draw(st.booleans()), draw(st.booleans())


def step(n: int, k: int, g: int, world: int, j: int, pad: bool) -> list[int]:
    """Units (global positions) every rank of ``world`` serves at step ``j``, ranks in order."""
    return [
        p for r in range(world) for p in elastic.batch_positions(n, k, g, world, r, j, pad).tolist()
    ]


@SETTINGS
@given(layouts(), st.integers(0, 3))
def test_world_equal_to_partitions_is_the_order_of_before(case: tuple, seed: int) -> None:
    n, g, worlds, pad, drop_last = case
    world = worlds[0]
    b = g // world
    t = elastic.global_batches(n, world, g, pad, drop_last)
    assert t == order.num_batches(order.rank_size(n, world, pad), b, drop_last)
    starts = [0, max(n // 2, 0), n] if n else [0]
    for r in range(world):
        for j in range(t):
            want = order.batch_positions(n, r, world, b, j, pad)
            got = elastic.batch_positions(n, world, g, world, r, j, pad)
            np.testing.assert_array_equal(got, want)
            runs = elastic.slice_runs(n, world, g, world, r, j, pad)
            if n:  # the engine's window segments too
                per_rank = order.rank_size(n, world, pad)
                assert runs_segments(starts, runs) == batch_segments(starts, per_rank, r, b, j)


@SETTINGS
@given(layouts())
def test_resume_on_other_worlds_serves_every_unit(case: tuple) -> None:
    """Steps on worlds[0] (K = worlds[0]), then resumed on each next world for a while: the union
    is every unit (pad) or the K-layout's units (no pad), repeats fewer than one global batch,
    ranks disjoint within a full step, none at all when N is a multiple of G."""
    n, g, worlds, pad, drop_last = case
    k = worlds[0]
    t = elastic.global_batches(n, k, g, pad, drop_last)
    served: list[int] = []
    stops = np.linspace(0, t, len(worlds) + 1).astype(int).tolist()
    for i, world in enumerate(worlds):
        for j in range(stops[i], stops[i + 1]):
            units = step(n, k, g, world, j, pad)
            assert len(units) <= g
            full = len(step(n, k, g, 1, j, pad)) == g
            if full and n >= k * order.rank_size(n, k, pad):  # no padding: ranks disjoint
                assert len(set(units)) == len(units) == g
            served += units
    base = [p for j in range(t) for p in step(n, k, g, k, j, pad)]
    assert set(served) == set(base)
    assert len(served) - len(set(served)) < g
    if pad and not drop_last:
        assert set(served) == set(range(n))
    if n % g == 0:
        assert sorted(served) == list(range(n))  # exactly once


@SETTINGS
@given(st.integers(1, 200), st.integers(1, 6), st.integers(0, 5))
def test_any_world_reads_slices_of_the_same_global_batch(n: int, k: int, j: int) -> None:
    """The physical world only cuts the layout's global batch: its ranks' batches concatenated are
    the one-rank batch (a shorter last step: the same units, wrapped)."""
    g = k * 6
    one = elastic.batch_positions(n, k, g, 1, 0, j, True)
    for world in (2, 3, 6):
        parts = [elastic.batch_positions(n, k, g, world, r, j, True) for r in range(world)]
        assert len({p.size for p in parts}) == 1  # every rank has a batch of the same size
        got = np.concatenate(parts)
        if one.size == g:
            np.testing.assert_array_equal(got, one)
        else:
            assert set(got.tolist()) == set(one.tolist())


@SETTINGS
@given(
    st.lists(st.integers(1, 9), min_size=0, max_size=40),
    st.sampled_from([1, 2, 3, 4, 6]),
    st.lists(st.sampled_from([1, 2, 3, 4, 5]), min_size=1, max_size=3),
    st.booleans(),
)
def test_budget_batches_resume_on_other_worlds(
    costs: list[int], k: int, worlds: list[int], pad: bool
) -> None:
    """Budget batches: K = world reproduces budget.rank_batches; a resume deals the canonical
    batches not yet served to the new world's ranks, every one of them served, repeats at most
    world - 1 whole batches, each within the budget."""
    bounds = budget.budget_bounds(costs, 9, k, pad)
    nb = bounds.size - 1
    for r in range(k):
        ids = elastic.budget_rank_ids(nb, k, k, r, 0)
        before = budget.rank_batches(bounds, r, k)
        np.testing.assert_array_equal(bounds[ids], before[:-1])
        np.testing.assert_array_equal(bounds[ids + 1], before[1:])
    offset, seen, repeats = 0, [], 0
    for i, world in enumerate([k, *worlds]):
        steps = elastic.budget_steps(nb, world, offset)
        take = steps if i == len(worlds) else steps // 2
        per_rank = [elastic.budget_rank_ids(nb, k, world, r, offset)[:take] for r in range(world)]
        assert len({ids.size for ids in per_rank}) == 1  # equal per-rank counts
        mine = [int(x) for t in range(take) for ids in per_rank for x in ids[t : t + 1]]
        repeats += len(mine) - len(set(mine) - set(seen))
        seen += mine
        offset += take * world
    assert set(seen) == set(range(nb))
    assert repeats <= max([k, *worlds]) - 1


def test_older_states_lay_out_on_their_world() -> None:
    state = {"version": 2, "world_size": 3, "batch_size": 5}
    assert resume.layout_of(state) == (3, 15, 0, 0)
