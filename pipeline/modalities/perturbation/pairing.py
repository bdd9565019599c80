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
        self.keys: list[np.ndarray] = []
        self.runs: list[np.ndarray] = []
        pools: list[np.ndarray] = []
        for _lvl, by in LEVEL_ORDER:
            key = self.key(by, pool)
            order = np.argsort(key, kind="stable")
            key = key[order]
            starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else key
            self.keys.append(key[starts])
            self.runs.append(np.r_[starts, key.size].astype(np.int64))
            pools.append(pool[order])
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
            keys, runs = self.keys[i], self.runs[i]
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


def make_pairs(
    ctx: MatchContext,
    cond_id: np.ndarray,
    max_per_condition: int,
    rng: np.random.Generator,
    pools: ControlPools | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """[P,2] (control, perturbed) local cell ids, at most `max_per_condition` per (split,
    condition); levels."""
    pert = np.flatnonzero(~ctx.is_control)
    r = rng.random(pert.size)
    order = np.lexsort((r, cond_id[pert], ctx.split[pert]))
    groups = combine(ctx.split[pert][order], cond_id[pert][order])
    chosen = np.sort(pert[order][rank_within(groups) < max_per_condition])
    ctrl, level = match_controls(ctx, chosen, rng, pools)
    return np.stack([ctrl, chosen], axis=1), level


SLOT_CHUNK = 1 << 20  # sentence slots per vectorised step: bounds the temporaries (~4 MB each)


def _uniform_below(rng: np.random.Generator, n: np.ndarray, width: int) -> np.ndarray:
    """int32 [len(n), width]: row i uniform in [0, n[i]). float32 draws (half the bytes of float64);
    the clip catches products that round up to n (float32 has 24 bits: fine for pools below
    millions)."""
    r = rng.random((n.size, width), dtype=np.float32)
    r *= n[:, None]
    pick = r.astype(np.int32)
    np.minimum(pick, (n - 1)[:, None], out=pick)
    return pick


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
    the plan builds a shard's slot tables at a time).

    Slot tables are the plan's largest arrays (~40 slots per perturbed cell with small groups),
    so they are int32 and filled in chunks of SLOT_CHUNK slots: full-size float64/int64
    temporaries cost more in page faults than in arithmetic. The random streams are consumed in
    the same order as one big draw would.
    """
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
    sent_g = -(-n_g // size)  # sentences per group
    g = np.repeat(np.arange(n_g.size), sent_g)  # group of each sentence
    first = (
        np.arange(g.size) - np.repeat(np.cumsum(sent_g) - sent_g, sent_g)
    ) * size  # its first slot in the group
    start, n = starts[g].astype(np.int32), n_g[g].astype(np.int32)
    step = max(1, SLOT_CHUNK // size)
    lane = np.arange(size, dtype=np.int32)
    pert_tab = np.empty((g.size, size), np.int32)
    for a in range(0, g.size, step):
        b = min(a + step, g.size)
        pick = _uniform_below(
            rng, n[a:b], size
        )  # slot -> cell of the group: a draw when topping up ...
        t = first[a:b, None].astype(np.int32) + lane
        np.copyto(
            pick, t, where=t < n[a:b, None]
        )  # ... else the group's own cells, in shuffled order
        pick += start[a:b, None]
        pert_tab[a:b] = cells[pick]
    # all slots of a sentence share shard, split, cell type and batch, hence one control pool per
    # sentence
    pools = pools if pools is not None else ControlPools(ctx)
    level, base, cnt = pools.lookup(cells[start + first])
    ctrl_tab = np.empty((g.size, size), np.int32)
    for a in range(0, g.size, step):
        b = min(a + step, g.size)
        pick = _uniform_below(rng, cnt[a:b].astype(np.int32), size)
        pick += base[a:b, None].astype(np.int32)
        ctrl_tab[a:b] = pools.every32[pick]
    return pert_tab, ctrl_tab, np.broadcast_to(NAMES[level][:, None], (g.size, size))
