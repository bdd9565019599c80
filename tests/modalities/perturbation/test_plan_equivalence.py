"""The plan's faster paths give exactly what the straightforward code gave: every shard byte
depends on them (pairs, sentence slot tables, sort orders, pool lookups, barcodes)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.modalities.perturbation import pairing
from pipeline.modalities.perturbation.obs_names import ObsNames
from pipeline.modalities.perturbation.pairing import (
    NAMES,
    ControlPools,
    MatchContext,
    combine,
    group_order,
    make_pairs,
    make_sentences,
    rank_within,
    stable_argsort,
)

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32]


@st.composite
def contexts(draw: st.DrawFn) -> tuple[MatchContext, np.ndarray, int]:
    """One source's matching columns (as tests/modalities/perturbation/test_plan.py draws them), sometimes with controls
    kept in train (a pool split other than the cells' own)."""
    n = draw(st.integers(2, 300))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    is_ctrl = rng.random(n) < draw(st.floats(0.02, 0.6))
    is_ctrl[rng.integers(n)] = True  # a source always has a control
    split = rng.integers(0, 3, n).astype(np.int8)
    ctx = MatchContext(
        home=rng.integers(0, draw(st.integers(1, 4)), n),
        split=split,
        cell_type=rng.integers(0, draw(st.integers(1, 4)), n).astype(np.int32),
        batch=rng.integers(0, draw(st.integers(1, 4)), n).astype(np.int32),
        is_control=is_ctrl,
        pool_split=np.zeros_like(split) if draw(st.booleans()) else None,
    )
    return ctx, rng.integers(0, 5, n).astype(np.int32), seed


def _uniform_below_ref(rng: np.random.Generator, n: np.ndarray, width: int) -> np.ndarray:
    r = rng.random((n.size, width), dtype=np.float32)
    r *= n[:, None]
    pick = r.astype(np.int32)
    np.minimum(pick, (n - 1)[:, None], out=pick)
    return pick


def _pairs_ref(ctx: MatchContext, cond_id: np.ndarray, cap: int, rng: np.random.Generator):
    pert = np.flatnonzero(~ctx.is_control)
    r = rng.random(pert.size)
    order = np.lexsort((r, cond_id[pert], ctx.split[pert]))
    groups = combine(ctx.split[pert][order], cond_id[pert][order])
    chosen = np.sort(pert[order][rank_within(groups) < cap])
    pools = ControlPools(ctx)
    level, first, cnt = pools.lookup(chosen)
    pick = first + (rng.random(level.shape) * cnt).astype(np.int64)
    return np.stack([pools.every[pick], chosen], axis=1), NAMES[level]


def _sentences_ref(ctx, perturbation, batch, size, rng, cells=None):
    """The sentence tables as planned before the index form (one chunk: same draws)."""
    pert = np.flatnonzero(~ctx.is_control) if cells is None else cells
    if pert.size == 0:
        empty = np.zeros((0, size), np.int32)
        return empty, empty, empty.astype(np.int8)
    key = combine(
        ctx.home[pert], ctx.split[pert], ctx.cell_type[pert], perturbation[pert], batch[pert]
    )
    order = np.lexsort((rng.random(pert.size), key))
    cells, key = pert[order].astype(np.int32), key[order]
    starts = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    n_g = np.diff(np.r_[starts, key.size])
    sent_g = -(-n_g // size)
    g = np.repeat(np.arange(n_g.size), sent_g)
    first = (np.arange(g.size) - np.repeat(np.cumsum(sent_g) - sent_g, sent_g)) * size
    start, n = starts[g].astype(np.int32), n_g[g].astype(np.int32)
    pick = _uniform_below_ref(rng, n, size)
    t = first[:, None].astype(np.int32) + np.arange(size, dtype=np.int32)
    np.copyto(pick, t, where=t < n[:, None])
    pert_tab = cells[pick + start[:, None]]
    pools = ControlPools(ctx)
    level, base, cnt = pools.lookup(cells[start + first])
    pick = _uniform_below_ref(rng, cnt.astype(np.int32), size)
    pick += base[:, None].astype(np.int32)
    ctrl_tab = pools.every32[pick]
    return pert_tab, ctrl_tab, np.broadcast_to(NAMES[level][:, None], (g.size, size))


@settings(max_examples=80, deadline=None)
@given(contexts(), st.integers(0, 6))
def test_pairs_equal_the_sorted_selection(args, cap: int) -> None:
    ctx, perts, seed = args
    cond = perts * 7 + ctx.cell_type
    got = make_pairs(ctx, cond, cap, np.random.default_rng(seed))
    want = _pairs_ref(ctx, cond, cap, np.random.default_rng(seed))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype


@settings(max_examples=80, deadline=None)
@given(contexts(), st.integers(1, 9), st.booleans(), st.sampled_from([1 << 20, 7, 1]))
def test_sentences_equal_the_masked_tables(args, size: int, subset: bool, chunk: int) -> None:
    """Any chunking of the slot draws (SLOT_CHUNK) gives the tables of one big draw."""
    ctx, perts, seed = args
    cells = None
    if subset:
        pert = np.flatnonzero(~ctx.is_control)
        cells = pert[np.random.default_rng(seed).random(pert.size) < 0.5]
    old = pairing.SLOT_CHUNK
    pairing.SLOT_CHUNK = chunk
    try:
        got = make_sentences(ctx, perts, ctx.batch, size, np.random.default_rng(seed), cells)
    finally:
        pairing.SLOT_CHUNK = old
    want = _sentences_ref(ctx, perts, ctx.batch, size, np.random.default_rng(seed), cells)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype and a.shape == b.shape


def test_fill_uniform_takes_float64_products_beyond_float32_counts() -> None:
    n = np.array([1, 3, (1 << 24) + 1, (1 << 30) + 7, 5], np.int32)
    offset = np.array([0, 10, 20, 30, 40], np.int32)
    got = np.empty((n.size, 33), np.int32)
    pairing._fill_uniform(np.random.default_rng(4), n, offset, got)
    want = _uniform_below_ref(np.random.default_rng(4), n, 33) + offset[:, None]
    np.testing.assert_array_equal(got, want)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 400), st.integers(1, 70_000), st.integers(0, 2**16), st.booleans())
def test_group_order_is_lexsort(n: int, span: int, seed: int, ties: bool) -> None:
    rng = np.random.default_rng(seed)
    key = rng.integers(0, span, n).astype(np.int64) + rng.integers(-5, 5)
    r = rng.random(n)
    if ties and n:  # equal draws keep their cell order, as lexsort's
        r = r[rng.integers(0, max(1, n // 3), n)]
        r[: n // 4] = 0.0
    np.testing.assert_array_equal(group_order(key, r), np.lexsort((r, key)))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(0, 300), st.integers(0, 2**16))
def test_stable_argsort_is_numpys(dtype, n: int, seed: int) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    lo = int(rng.integers(info.min, info.max))
    hi = min(info.max, lo + int(rng.choice([3, 255, 65_535, 65_536, 1 << 20])))
    keys = rng.integers(lo, hi, n, endpoint=True).astype(dtype)
    np.testing.assert_array_equal(stable_argsort(keys), np.argsort(keys, kind="stable"))


@settings(max_examples=60, deadline=None)
@given(contexts())
def test_pool_tables_answer_as_the_search(args) -> None:
    ctx, _, _ = args
    pools = ControlPools(ctx)
    assert any(t is not None for t in pools.tables)
    queries = np.arange(ctx.home.size)
    got = pools.lookup(queries)
    pools.tables = [None] * len(pools.tables)
    for a, b in zip(got, pools.lookup(queries), strict=True):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=6), min_size=0, max_size=40), st.integers(0, 99))
def test_names_of_one_width_gather_as_ragged_ones(values: list[bytes], seed: int) -> None:
    names = ObsNames.from_values(values)
    rows = np.random.default_rng(seed).integers(0, max(1, len(values)), 25).astype(np.int32)
    rows = rows[: 25 if values else 0]
    got = names.take(rows)
    lengths = np.diff(names.offsets)[rows]
    want = np.zeros(rows.size + 1, np.int64)
    np.cumsum(lengths, out=want[1:])
    data = b"".join(values[i] for i in rows.tolist())
    np.testing.assert_array_equal(got[0], want)
    assert got[1].dtype == np.uint8 and got[1].tobytes() == data
