"""Invariants of the pure planning functions (matching, pairs, sentences, splits, conditions)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.modalities.perturbation.conditions import build_conditions
from pipeline.modalities.perturbation.pairing import (
    LEVEL_ORDER,
    ControlPools,
    MatchContext,
    make_pairs,
    make_sentences,
    match_controls,
)


@st.composite
def contexts(draw: st.DrawFn) -> tuple[MatchContext, np.ndarray, int]:
    n = draw(st.integers(2, 300))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    is_ctrl = rng.random(n) < draw(st.floats(0.02, 0.6))
    is_ctrl[rng.integers(n)] = (
        True  # a source always has a control (checked earlier, with a clear error)
    )
    ctx = MatchContext(
        home=rng.integers(0, draw(st.integers(1, 4)), n),
        split=rng.integers(0, 3, n).astype(np.int8),
        cell_type=rng.integers(0, draw(st.integers(1, 4)), n).astype(np.int32),
        batch=rng.integers(0, draw(st.integers(1, 4)), n).astype(np.int32),
        is_control=is_ctrl,
    )
    perts = rng.integers(0, 5, n).astype(np.int32)
    return ctx, perts, seed


def _level_holds(ctx: MatchContext, q: np.ndarray, c: np.ndarray, level: np.ndarray) -> None:
    same_ct = ctx.cell_type[q] == ctx.cell_type[c]
    same_b = ctx.batch[q] == ctx.batch[c]
    same_split = ctx.split[q] == ctx.split[c]
    assert ctx.is_control[c].all()
    assert (same_ct & same_b & same_split)[level == 0].all()
    assert (same_ct & same_split)[level == 1].all()
    assert same_split[level == 2].all()


@settings(max_examples=60, deadline=None)
@given(contexts())
def test_matching_respects_levels_and_prefers_best(
    args: tuple[MatchContext, np.ndarray, int],
) -> None:
    ctx, _, seed = args
    q = np.flatnonzero(~ctx.is_control)
    c, level = match_controls(ctx, q, np.random.default_rng(seed))
    _level_holds(ctx, q, c, level)
    # no better level was available: an exact match is taken whenever one exists in the split
    ctrl = np.flatnonzero(ctx.is_control)
    for qi, lv in zip(q.tolist(), level.tolist(), strict=True):
        exact = (
            (ctx.cell_type[ctrl] == ctx.cell_type[qi])
            & (ctx.batch[ctrl] == ctx.batch[qi])
            & (ctx.split[ctrl] == ctx.split[qi])
        ).any()
        assert (lv == 0) == bool(exact)
    assert len({lvl for lvl, _ in LEVEL_ORDER}) == 4


@settings(max_examples=60, deadline=None)
@given(contexts())
def test_pool_lookup_is_the_first_level_a_binary_search_finds(
    args: tuple[MatchContext, np.ndarray, int],
) -> None:
    """The lookup searches each level's distinct keys once; the plan (so every shard byte)
    depends on it giving what two binary searches over all of the level's sorted pool keys give:
    the first level with a candidate, where its candidates start in ``every``, how many."""
    ctx, _, _ = args
    pools = ControlPools(ctx)
    queries = np.arange(ctx.home.size)
    level, first, cnt = pools.lookup(queries)
    for q in queries.tolist():
        for i, (_lvl, by) in enumerate(LEVEL_ORDER):
            lo, hi = int(pools.offsets[i]), int(pools.offsets[i + 1])
            keys = pools.key(by, pools.every[lo:hi])
            want = pools.key(by, np.array([q]))[0]
            a, b = np.searchsorted(keys, want, "left"), np.searchsorted(keys, want, "right")
            if b > a:
                assert (level[q], first[q], cnt[q]) == (i, lo + a, b - a)
                break


@settings(max_examples=60, deadline=None)
@given(contexts(), st.integers(0, 5))
def test_pairs_cap_per_condition(args: tuple[MatchContext, np.ndarray, int], cap: int) -> None:
    ctx, perts, seed = args
    cond = perts * 7 + ctx.cell_type
    pairs, level = make_pairs(ctx, cond, cap, np.random.default_rng(seed))
    assert pairs.shape[1] == 2 and level.shape == (pairs.shape[0],)
    assert not ctx.is_control[pairs[:, 1]].any() and np.unique(pairs[:, 1]).size == pairs.shape[0]
    _level_holds(ctx, pairs[:, 1], pairs[:, 0], level)
    keys = ctx.split[pairs[:, 1]].astype(np.int64) * 1000 + cond[pairs[:, 1]]
    if keys.size:
        assert np.unique(keys, return_counts=True)[1].max() <= cap
    pert = np.flatnonzero(~ctx.is_control)
    groups = np.unique(ctx.split[pert].astype(np.int64) * 1000 + cond[pert], return_counts=True)[1]
    assert pairs.shape[0] == np.minimum(groups, cap).sum()


@settings(max_examples=60, deadline=None)
@given(contexts(), st.integers(1, 9))
def test_sentences_cover_groups_homogeneously(
    args: tuple[MatchContext, np.ndarray, int], size: int
) -> None:
    ctx, perts, seed = args
    sp, sc, level = make_sentences(ctx, perts, ctx.batch, size, np.random.default_rng(seed))
    assert sp.shape == sc.shape == level.shape and sp.shape[1] == size
    for col in (ctx.home, ctx.split, ctx.cell_type, ctx.batch, perts):
        assert (col[sp] == col[sp[:, :1]]).all()
    assert ctx.is_control[sc].all() and not ctx.is_control[sp].any()
    pert = np.flatnonzero(~ctx.is_control)
    assert set(np.unique(sp).tolist()) == set(pert.tolist())
    _level_holds(ctx, sp.ravel(), sc.ravel(), level.ravel())


def test_conditions_are_one_hot_blocks() -> None:
    codes = {"perturbation": np.array([0, 1, 1, 2]), "cell_type": np.array([0, 0, 0, 1])}
    vocab = {"perturbation": ["a", "b", "control"], "cell_type": ["x", "y"]}
    t = build_conditions(codes, ["perturbation", "cell_type"], vocab)
    assert t.vectors.shape == (3, 5) and (t.vectors.sum(1) == 2).all()
    np.testing.assert_array_equal(
        t.codes[t.cond_id], np.stack([codes["perturbation"], codes["cell_type"]], 1)
    )
    assert t.cond_id[1] == t.cond_id[2]
    feats = np.arange(6, dtype=np.float32).reshape(3, 2)
    tf = build_conditions(codes, ["perturbation", "cell_type"], vocab, features=feats)
    np.testing.assert_array_equal(tf.vectors[t.cond_id[3], :2], feats[2])
