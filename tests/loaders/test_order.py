"""Properties of the epoch order (loaders.epoch.order): permutation, disjoint ranks, worker/resume
invariance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.epoch import order

SETTINGS = settings(max_examples=60, deadline=None)
counts_st = st.lists(st.integers(0, 40), min_size=0, max_size=12)


def rank_sequence(
    counts: list[int],
    seed: int,
    epoch: int,
    window: int,
    rank: int,
    world: int,
    bs: int,
    pad: bool,
    drop_last: bool,
    shuffle: bool = True,
    num_workers: int = 0,
    start: int = 0,
    group: int = 1,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The batches a rank sees, merging workers' items (runs of ``group`` batches) the way torch's
    DataLoader does (round-robin from worker 0, an item at a time)."""
    total = int(np.sum(counts))
    nb = order.num_batches(order.rank_size(total, world, pad), bs, drop_last)
    per_worker = [
        [
            [
                order.batch_units(counts, seed, epoch, window, rank, world, bs, j, pad, shuffle)
                for j in run
            ]
            for run in order.worker_runs(nb, w, num_workers, start, group)
        ]
        for w in range(max(1, num_workers))
    ]
    merged = []
    for i in range(max((len(p) for p in per_worker), default=0)):
        for p in per_worker:
            if i < len(p):
                merged.extend(p[i])
    return merged


def as_pairs(batches: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[int, int]]:
    return [(int(s), int(u)) for sh, loc in batches for s, u in zip(sh, loc, strict=True)]


def all_units(counts: list[int]) -> list[tuple[int, int]]:
    return [(s, u) for s, c in enumerate(counts) for u in range(c)]


@SETTINGS
@given(
    counts=counts_st,
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 5),
    window=st.integers(1, 5),
    bs=st.integers(1, 17),
    workers=st.integers(0, 4),
    shuffle=st.booleans(),
)
def test_single_process_epoch_is_a_permutation(
    counts: list[int], seed: int, epoch: int, window: int, bs: int, workers: int, shuffle: bool
) -> None:
    got = as_pairs(
        rank_sequence(counts, seed, epoch, window, 0, 1, bs, True, False, shuffle, workers)
    )
    assert sorted(got) == all_units(counts)
    if not shuffle:
        assert got == all_units(counts)


@SETTINGS
@given(
    counts=counts_st,
    seed=st.integers(0, 1000),
    window=st.integers(1, 5),
    world=st.integers(1, 5),
    bs=st.integers(1, 9),
    drop_last=st.booleans(),
)
def test_ranks_disjoint_without_pad_and_equal_batch_counts(
    counts: list[int], seed: int, window: int, world: int, bs: int, drop_last: bool
) -> None:
    seqs = [
        rank_sequence(counts, seed, 0, window, r, world, bs, False, drop_last) for r in range(world)
    ]
    assert len({len(s) for s in seqs}) == 1
    units = [u for s in seqs for u in as_pairs(s)]
    assert len(units) == len(set(units))
    total = sum(counts)
    if not drop_last:  # only the last total % world units are dropped
        assert len(units) == total - total % world


@SETTINGS
@given(
    counts=counts_st,
    seed=st.integers(0, 1000),
    window=st.integers(1, 5),
    world=st.integers(1, 5),
    bs=st.integers(1, 9),
)
def test_pad_covers_everything_and_every_rank_gets_work(
    counts: list[int], seed: int, window: int, world: int, bs: int
) -> None:
    total = sum(counts)
    seqs = [rank_sequence(counts, seed, 0, window, r, world, bs, True, False) for r in range(world)]
    assert len({len(s) for s in seqs}) == 1
    sizes = {len(as_pairs(s)) for s in seqs}
    assert sizes == ({0} if total == 0 else {-(-total // world)})
    union = {u for s in seqs for u in as_pairs(s)}
    assert union == set(all_units(counts))


@SETTINGS
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=8).filter(lambda c: sum(c) >= 10),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 50),
    window=st.integers(1, 4),
)
def test_consecutive_epochs_differ(counts: list[int], seed: int, epoch: int, window: int) -> None:
    total = sum(counts)
    a = order.global_units(counts, seed, epoch, window, 0, total)
    b = order.global_units(counts, seed, epoch + 1, window, 0, total)
    assert not (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))


@SETTINGS
@given(
    counts=counts_st,
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 3),
    window=st.integers(1, 5),
    world=st.integers(1, 5),
    bs=st.integers(1, 9),
    workers=st.integers(1, 4),
    pad=st.booleans(),
    drop_last=st.booleans(),
    group=st.integers(1, 5),
)
def test_order_independent_of_num_workers(
    counts: list[int],
    seed: int,
    epoch: int,
    window: int,
    world: int,
    bs: int,
    workers: int,
    pad: bool,
    drop_last: bool,
    group: int,
) -> None:
    for rank in range(world):
        ref = rank_sequence(
            counts, seed, epoch, window, rank, world, bs, pad, drop_last, num_workers=0
        )
        got = rank_sequence(
            counts,
            seed,
            epoch,
            window,
            rank,
            world,
            bs,
            pad,
            drop_last,
            num_workers=workers,
            group=group,
        )
        assert as_pairs(got) == as_pairs(ref)
        assert [len(b[0]) for b in got] == [len(b[0]) for b in ref]


@SETTINGS
@given(
    counts=counts_st,
    seed=st.integers(0, 1000),
    window=st.integers(1, 5),
    world=st.integers(1, 3),
    bs=st.integers(1, 9),
    workers=st.integers(0, 4),
    k=st.integers(0, 20),
    pad=st.booleans(),
    group=st.integers(1, 5),
)
def test_resume_yields_exactly_the_remaining_batches(
    counts: list[int],
    seed: int,
    window: int,
    world: int,
    bs: int,
    workers: int,
    k: int,
    pad: bool,
    group: int,
) -> None:
    for rank in range(world):
        full = rank_sequence(counts, seed, 2, window, rank, world, bs, pad, False)
        rest = rank_sequence(
            counts,
            seed,
            2,
            window,
            rank,
            world,
            bs,
            pad,
            False,
            num_workers=workers,
            start=k,
            group=group,
        )
        assert len(rest) == max(0, len(full) - k)
        for a, b in zip(rest, full[k:], strict=True):
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@SETTINGS
@given(counts=counts_st, seed=st.integers(0, 1000), window=st.integers(1, 5), data=st.data())
def test_global_slice_matches_full_order(
    counts: list[int], seed: int, window: int, data: st.DataObject
) -> None:
    total = sum(counts)
    start = data.draw(st.integers(0, total))
    stop = data.draw(st.integers(start, total))
    full = order.global_units(counts, seed, 1, window, 0, total)
    part = order.global_units(counts, seed, 1, window, start, stop)
    assert np.array_equal(part[0], full[0][start:stop]) and np.array_equal(
        part[1], full[1][start:stop]
    )
    # windows are contiguous groups of permuted shards
    shard_order, starts = order.window_bounds(counts, seed, 1, window)
    for w in range(len(starts) - 1):
        assert set(full[0][starts[w] : starts[w + 1]].tolist()) <= set(
            shard_order[w * window : (w + 1) * window].tolist()
        )


def test_small_split_many_ranks() -> None:
    # 2 units, 5 ranks: with pad everyone gets one (wrapped) unit; without, nobody gets anything.
    assert [order.rank_positions(2, r, 5, True, 0, 10).tolist() for r in range(5)] == [
        [0],
        [1],
        [0],
        [1],
        [0],
    ]
    assert all(order.rank_size(2, 5, False) == 0 for _ in range(5))
    assert order.rank_size(0, 3, True) == 0
    assert order.num_batches(0, 4, False) == 0


def test_big_counts_stay_bounded() -> None:
    # a billion units: a batch only materialises its own window
    counts = np.full(100_000, 10_000, dtype=np.int64)
    s, u = order.batch_units(counts, 0, 0, 4, rank=3, world=8, batch_size=256, j=12345, pad=True)
    assert s.shape == (256,) and (u < 10_000).all()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        order.window_bounds([1, 2], -1, 0, 2)
    with pytest.raises(ValueError):
        order.window_bounds([1, 2], 0, 0, 0)
    with pytest.raises(ValueError):
        order.num_batches(3, 0, False)
    with pytest.raises(ValueError):
        order.worker_batches(3, 2, 2)


@SETTINGS
@given(
    counts=counts_st,
    window=st.integers(1, 4),
    world=st.integers(1, 4),
    bs=st.integers(1, 30),
    pad=st.booleans(),
    epoch=st.integers(0, 3),
    data=st.data(),
)
def test_batch_segments_cover_exactly_the_batch_positions(
    counts: list[int], window: int, world: int, bs: int, pad: bool, epoch: int, data: st.DataObject
) -> None:
    """The dataset reads batch j as runs inside windows (loaders.epoch.schedule): those runs,
    mapped back to global positions, are batch_positions(j), in order, and each run stays inside
    its window."""
    from loaders.epoch.schedule import WindowSchedule, batch_segments

    total = int(np.sum(counts))
    per_rank = order.rank_size(total, world, pad)
    nb = order.num_batches(per_rank, bs, drop_last=False)
    if nb == 0:
        return
    rank = data.draw(st.integers(0, world - 1))
    bounds = order.window_bounds(counts, 0, epoch, window)[1].tolist()
    plans = [batch_segments(bounds, per_rank, rank, bs, j) for j in range(nb)]
    for j, (segments, wins) in enumerate(plans):
        got = np.concatenate([np.arange(bounds[w] + lo, bounds[w] + hi) for w, lo, hi in segments])
        np.testing.assert_array_equal(got, order.batch_positions(total, rank, world, bs, j, pad))
        assert all(0 <= lo < hi <= bounds[w + 1] - bounds[w] for w, lo, hi in segments)
        assert wins == list(dict.fromkeys(w for w, _, _ in segments))
    schedule, seen = WindowSchedule(plans), []
    while (plan := schedule.next_plan()) is not None:
        seen.append(plan)
        later = [
            w for p in plans[len(seen) :] for w in p[1] if w not in {x for q in seen for x in q[1]}
        ]
        assert schedule.next_window == (later[0] if later else None)
    assert seen == plans
