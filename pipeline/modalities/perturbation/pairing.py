"""Control matching, control<->perturbed pairs and cell sentences, as vectorised numpy over one
source.

A perturbed cell is matched to a random control of the best available level; each level prefers a
control already in the perturbed cell's shard (no duplication) and otherwise takes one from
elsewhere in the source, which the shard then stores as a non-primary duplicate:

  exact      same (cell type, batch)  [strategy "batch"] or same cell type [strategy "random"], same
  split
  cell_type  same cell type, same split (batch fallback)
  split      any control of the split
  source     any control of the source (another split)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVELS = ("exact", "cell_type", "split", "source")
# (level, key columns), tried in order: in-shard candidates first so that duplicates are rare.
LEVEL_ORDER: tuple[tuple[int, tuple[str, ...]], ...] = (
    (0, ("shard", "split", "cell_type", "batch")),
    (0, ("split", "cell_type", "batch")),
    (1, ("shard", "split", "cell_type")),
    (1, ("split", "cell_type")),
    (2, ("shard", "split")),
    (2, ("split",)),
    (3, ()),
)


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of integer keys; keys that fit 16 bits above their
    minimum (shards, combined codes) are sorted as uint16, which numpy sorts by counting (radix):
    several times cheaper than the comparison sort of int64."""
    if keys.size and keys.dtype.kind in "iu" and keys.dtype.itemsize <= 8:
        low, high = int(keys.min()), int(keys.max())
        if high - low <= np.iinfo(np.uint16).max:
            # in Python ints: a narrow signed type would wrap in keys - low
            shifted = keys - np.array(low, keys.dtype) if low >= 0 else keys.astype(np.int64) - low
            return np.argsort(shifted.astype(np.uint16), kind="stable")
    return np.argsort(keys, kind="stable")


def combine(*cols: np.ndarray) -> np.ndarray:
    """Pack integer columns into one int64 key that sorts like the tuple."""
    key = np.zeros(cols[0].shape, np.int64)
    for c in cols:
        c = c.astype(np.int64)
        key = key * (int(c.max(initial=0)) + 1) + c
    return key


@dataclass(frozen=True)
class MatchContext:
    """Per-cell columns of one source (local cell indices 0..n-1)."""

    home: np.ndarray  # int64 shard of each cell
    split: np.ndarray  # int8
    cell_type: np.ndarray  # int32
    batch: np.ndarray  # int32 (zeros when the strategy ignores batch)
    is_control: np.ndarray  # bool
    pool_split: np.ndarray | None = (
        None  # int8: the split whose controls a cell draws from (default: its own)
    )

    def column(self, name: str) -> np.ndarray:
        """A matching key column; "split" is the pool split, so the levels' "same split" means the
        split whose controls a cell may use (its own, or train when controls stay in train)."""
        split = self.split if self.pool_split is None else self.pool_split
        return {
            "shard": self.home,
            "split": split,
            "cell_type": self.cell_type,
            "batch": self.batch,
        }[name]


class ControlPools:
    """The controls of one source sorted by the key of every level of LEVEL_ORDER.

    Built once per source and queried many times (the pairs, then the sentences of each shard).
    Keys use radices from the whole source, so the keys of any subset of cells agree with the
    pools' keys.
    """

    def __init__(self, ctx: MatchContext) -> None:
        self.ctx = ctx
        self.radix = {
            c: int(ctx.column(c).max(initial=0)) + 1
            for c in ("shard", "split", "cell_type", "batch")
        }
        pool = np.flatnonzero(ctx.is_control)
        # per level: the distinct keys, sorted, and where each one's run starts in the sorted pool
        # (a query is one search among the few distinct keys, not two among every control)
        # and, where the key range is at most about the cells, a table key -> run replacing it
        self.keys: list[np.ndarray] = []
        self.runs: list[np.ndarray] = []
        self.tables: list[np.ndarray | None] = []
        pools: list[np.ndarray] = []
        for _lvl, by in LEVEL_ORDER:
            key = self.key(by, pool)
            order = stable_argsort(key)
            key = key[order]
            starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else key
            self.keys.append(key[starts])
            self.runs.append(np.r_[starts, key.size].astype(np.int64))
            pools.append(pool[order])
            span = math.prod(self.radix[c] for c in by)
            table = None
            if span <= ctx.home.size + (1 << 16):
                table = np.full(span, -1, np.int32)
                table[key[starts]] = np.arange(starts.size, dtype=np.int32)
            self.tables.append(table)
        self.offsets = np.cumsum([0] + [p.size for p in pools])
        self.every = np.concatenate(pools)  # pool of level i = every[offsets[i]:offsets[i + 1]]
        self.every32 = self.every.astype(np.int32)

    def key(self, by: tuple[str, ...], cells: np.ndarray) -> np.ndarray:
        key = np.zeros(cells.shape, np.int64)
        for c in by:
            key = key * self.radix[c] + self.ctx.column(c)[cells]
        return key

    def lookup(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each query cell, the best level with a non-empty control pool: (level, first, count).

        Candidates for query i are `every[first[i]:first[i] + count[i]]`; the source has at least
        one control, so the last level (the whole source) always matches.
        """
        level = np.full(queries.shape, -1, np.int8)
        first = np.zeros(queries.shape, np.int64)
        cnt = np.zeros(queries.shape, np.int64)
        for i, (_lvl, by) in enumerate(LEVEL_ORDER):
            todo = np.flatnonzero(level < 0)
            if todo.size == 0:
                break
            q = self.key(by, queries[todo])
            keys, runs, table = self.keys[i], self.runs[i], self.tables[i]
            if table is not None:
                j = table[q]
                hit = j >= 0
            else:
                j = np.searchsorted(keys, q)
                hit = j < keys.size
                hit[hit] = keys[j[hit]] == q[hit]
            j = j[hit]
            level[todo[hit]] = i
            first[todo[hit]] = self.offsets[i] + runs[j]
            cnt[todo[hit]] = runs[j + 1] - runs[j]
        return level, first, cnt


NAMES = np.array(
    [lvl for lvl, _ in LEVEL_ORDER], np.int8
)  # LEVEL_ORDER position -> index into LEVELS
# LEVEL_ORDER position -> whether its pool may hold controls of other shards (the others hold only
# the shard's own cells, which are never duplicated)
AWAY = np.array(["shard" not in by for _, by in LEVEL_ORDER])


def match_controls(
    ctx: MatchContext,
    queries: np.ndarray,
    rng: np.random.Generator,
    pools: ControlPools | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(control cell, level) for each query cell, one uniform draw from its best pool."""
    pools = pools if pools is not None else ControlPools(ctx)
    level, first, cnt = pools.lookup(queries)
    pick = first + (rng.random(level.shape) * cnt).astype(np.int64)
    return pools.every[pick], NAMES[level]


def rank_within(groups: np.ndarray) -> np.ndarray:
    """0,1,2,... within runs of equal values of a sorted array."""
    if groups.size == 0:
        return groups.astype(np.int64)
    starts = np.r_[0, np.flatnonzero(np.diff(groups)) + 1]
    sizes = np.diff(np.r_[starts, groups.size])
    return np.arange(groups.size) - np.repeat(starts, sizes)


def group_order(key: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``np.lexsort((r, key))`` for random floats ``r`` in [0, 1): a stable LSD radix sort, four
    16-bit passes over r's bit pattern (ordered like r for non-negative floats) and one over the
    key's offsets from its minimum when they fit 16 bits; numpy's stable argsort of uint16 is a
    counting sort, so this is 2-3x cheaper than lexsort's two comparison sorts."""
    bits = r.view(np.uint64)
    order = np.argsort(bits.astype(np.uint16), kind="stable")
    for shift in (16, 32, 48):
        order = order[
            np.argsort((bits[order] >> np.uint64(shift)).astype(np.uint16), kind="stable")
        ]
    return order[stable_argsort(key[order])]


def _dense(keys: np.ndarray) -> bool:
    """Whether a count over the key range is cheap: at most a few times the items (combined
    codes such as split x condition); else count the distinct keys, which sorts."""
    return keys.size > 0 and keys.min() >= 0 and int(keys.max()) <= 4 * keys.size + 1024


def group_counts(keys: np.ndarray) -> np.ndarray:
    """``np.unique(keys, return_counts=True)[1]``: the size of each group of equal keys."""
    if _dense(keys):
        counts = np.bincount(keys)
        return counts[counts > 0]
    return np.unique(keys, return_counts=True)[1]


def _group_sizes(groups: np.ndarray) -> np.ndarray:
    """The size of each item's group (equal keys)."""
    if _dense(groups):
        return np.bincount(groups)[groups]
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    return counts[inverse]


def make_pairs(
    ctx: MatchContext,
    cond_id: np.ndarray,
    max_per_condition: int,
    rng: np.random.Generator,
    pools: ControlPools | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """[P,2] (control, perturbed) local cell ids, at most `max_per_condition` per (split,
    condition), the first by a random draw; levels. Only groups over the cap are sorted: the
    others keep every cell, and a mask keeps `chosen` in cell order without a sort."""
    pert = np.flatnonzero(~ctx.is_control)
    r = rng.random(pert.size)
    groups = combine(ctx.split[pert], cond_id[pert])
    keep = np.ones(pert.size, bool)
    if pert.size:
        over = np.flatnonzero(_group_sizes(groups) > max_per_condition)
        if over.size:
            order = over[group_order(groups[over], r[over])]
            keep[order[rank_within(groups[order]) >= max_per_condition]] = False
    chosen = pert[keep]
    ctrl, level = match_controls(ctx, chosen, rng, pools)
    return np.stack([ctrl, chosen], axis=1), level


SLOT_CHUNK = 1 << 16  # sentence slots per vectorised step: its scratch (256 KB each) stays in cache
EXACT_F32 = 1 << 24  # counts up to this are exact float32s


def _fill_uniform(
    rng: np.random.Generator, n: np.ndarray, offset: np.ndarray, out: np.ndarray
) -> None:
    """``out[i, j] = offset[i] + u`` with ``u`` uniform in [0, n[i]) (int32), drawn in chunks of
    SLOT_CHUNK slots into reused scratch (fresh multi-MB temporaries cost more in page faults than
    the arithmetic). A float32 draw times n, truncated, clipped to n - 1 (the product can round
    up to n). Up to 2**24 the float32 product is the float64 product rounded to float32, so both
    give the same picks; the float64 path is kept for larger n. The random stream is consumed as
    by one draw of the whole table, whatever the chunks."""
    size = out.shape[1]
    step = max(1, SLOT_CHUNK // size)
    rows = min(step, out.shape[0])
    fbuf = np.empty((rows, size), np.float32)
    ibuf = np.empty((rows, size), np.int32)
    factor = n.astype(np.float32) if int(n.max(initial=0)) <= EXACT_F32 else n
    for a in range(0, out.shape[0], step):
        b = min(a + step, out.shape[0])
        r, pick = fbuf[: b - a], ibuf[: b - a]
        rng.random(dtype=np.float32, out=r)
        np.multiply(r, factor[a:b, None], out=r, casting="same_kind")
        np.copyto(pick, r, casting="unsafe")
        np.minimum(pick, (n[a:b] - 1)[:, None], out=pick)
        np.add(pick, offset[a:b, None], out=out[a:b])


@dataclass(frozen=True)
class Picks:
    """A shard's sentences as indices: `pert` into `cells` (its perturbed cells in group order),
    `ctrl` into the pools' `every`; per sentence, its `level` and `pool` (position in
    LEVEL_ORDER). The plan maps them to shard rows with one gather each (a table of source cells
    would take a second), and looks for duplicated controls only among the sentences whose pool
    reaches beyond the shard (see AWAY)."""

    cells: np.ndarray  # int32 [N]
    pert: np.ndarray  # int32 [S, L]
    ctrl: np.ndarray  # int32 [S, L]
    level: np.ndarray  # int8 [S]
    pool: np.ndarray  # int8 [S]


def make_sentences(
    ctx: MatchContext,
    perturbation: np.ndarray,
    batch: np.ndarray,
    size: int,
    rng: np.random.Generator,
    cells: np.ndarray | None = None,
    pools: ControlPools | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sentences of `size` perturbed cells of one (shard, cell type, perturbation, batch) group.

    Every cell of a group appears in its sentences; the last sentence is topped up by draws with
    replacement from the group (so a short group yields one sentence sampled with replacement).
    Returns pert [S,L], matched ctrl [S,L] (an independent control draw per slot) and the control
    levels [S,L] (a read-only broadcast of one level per sentence). Sentences come sorted by
    group, hence by shard. `cells` restricts the sentences to some perturbed cells (one shard's:
    the plan builds a shard's slot tables at a time, as `sentence_picks`).
    """
    pools = pools if pools is not None else ControlPools(ctx)
    p = sentence_picks(ctx, perturbation, batch, size, rng, pools, cells)
    return (
        np.take(p.cells, p.pert),
        np.take(pools.every32, p.ctrl),
        np.broadcast_to(p.level[:, None], p.pert.shape),
    )


def sentence_picks(
    ctx: MatchContext,
    perturbation: np.ndarray,
    batch: np.ndarray,
    size: int,
    rng: np.random.Generator,
    pools: ControlPools,
    cells: np.ndarray | None = None,
) -> Picks:
    """`make_sentences` as indices (see Picks). Slot tables are the plan's largest arrays (~40
    slots per perturbed cell with small groups), so they are int32. Every slot of the pert table
    is drawn, then the group's own cells are written over their slots (the draws consume the
    random stream as before; the cells are one scatter, not a mask over every slot)."""
    pert = np.flatnonzero(~ctx.is_control) if cells is None else cells
    if pert.size == 0:
        empty = np.zeros((0, size), np.int32)
        none = np.zeros(0, np.int8)
        return Picks(np.zeros(0, np.int32), empty, empty, none, none)
    key = combine(
        ctx.home[pert], ctx.split[pert], ctx.cell_type[pert], perturbation[pert], batch[pert]
    )
    order = group_order(key, rng.random(pert.size))
    cells, key = pert[order].astype(np.int32), key[order]
    starts = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    n_g = np.diff(np.r_[starts, key.size])
    sent_g = -(-n_g // size)  # sentences per group
    before = np.cumsum(sent_g) - sent_g  # sentences of the groups before each group
    g = np.repeat(np.arange(n_g.size), sent_g)  # group of each sentence
    first = (np.arange(g.size) - before[g]) * size  # its first slot in the group
    start = starts[g].astype(np.int32)
    pert_tab = np.empty((g.size, size), np.int32)
    _fill_uniform(rng, n_g[g].astype(np.int32), start, pert_tab)
    # the k-th cell of a group (in shuffled order) takes slot k of the group's sentences
    slot = np.repeat(before * size - starts, n_g) + np.arange(cells.size)
    pert_tab.reshape(-1)[slot] = np.arange(cells.size, dtype=np.int32)
    # all slots of a sentence share shard, split, cell type and batch, hence one control pool per
    # sentence
    level, base, cnt = pools.lookup(cells[start + first])
    ctrl_tab = np.empty((g.size, size), np.int32)
    _fill_uniform(rng, cnt.astype(np.int32), base.astype(np.int32), ctrl_tab)
    return Picks(cells, pert_tab, ctrl_tab, NAMES[level], level)
