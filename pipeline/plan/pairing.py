"""Control matching, control<->perturbed pairs and cell sentences, as vectorised numpy over one source.

A perturbed cell is matched to a random control of the best available level; each level prefers a control
already in the perturbed cell's shard (no duplication) and otherwise takes one from elsewhere in the source,
which the shard then stores as a non-primary duplicate:

  exact      same (cell type, batch)  [strategy "batch"] or same cell type [strategy "random"], same split
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
    (0, ("shard", "split", "cell_type", "batch")), (0, ("split", "cell_type", "batch")),
    (1, ("shard", "split", "cell_type")), (1, ("split", "cell_type")),
    (2, ("shard", "split")), (2, ("split",)),
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

    def level_keys(self) -> list[tuple[int, np.ndarray]]:
        """Keys of LEVEL_ORDER: each level first within the query's own shard, then anywhere in the source."""
        ct, b, h, sp = self.cell_type, self.batch, self.home, self.split
        cols = {"shard": h, "split": sp, "cell_type": ct, "batch": b}
        return [(lvl, combine(*(cols[c] for c in by)) if by else np.zeros_like(h)) for lvl, by in LEVEL_ORDER]


def control_pools(ctx: MatchContext, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """For each query cell, the best level with a non-empty control pool: (level, lo, count, sorted pools).

    Candidates for query i are `pools[level[i]][lo[i]:lo[i] + count[i]]`; the source has at least one control,
    so the last level (the whole source) always matches.
    """
    pool = np.flatnonzero(ctx.is_control)
    level = np.full(queries.shape, -1, np.int8)
    lo = np.zeros(queries.shape, np.int64)
    cnt = np.zeros(queries.shape, np.int64)
    pools: list[np.ndarray] = []
    for i, (_lvl, key) in enumerate(ctx.level_keys()):
        order = np.argsort(key[pool], kind="stable")
        sorted_keys = key[pool][order]
        pools.append(pool[order])
        todo = np.flatnonzero(level < 0)
        if todo.size == 0:
            continue
        q = key[queries[todo]]
        a, b = np.searchsorted(sorted_keys, q, "left"), np.searchsorted(sorted_keys, q, "right")
        hit = b > a
        level[todo[hit]] = i
        lo[todo[hit]], cnt[todo[hit]] = a[hit], (b - a)[hit]
    return level, lo, cnt, pools


def draw_controls(level: np.ndarray, lo: np.ndarray, cnt: np.ndarray, pools: list[np.ndarray],
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One uniform draw per query from its pool; returns (control cell, level name index into LEVELS)."""
    offsets = np.cumsum([0] + [p.size for p in pools])
    pick = offsets[level] + lo + (rng.random(level.shape) * cnt).astype(np.int64)
    names = np.array([lvl for lvl, _ in LEVEL_ORDER], np.int8)
    return np.concatenate(pools)[pick], names[level]


def match_controls(ctx: MatchContext, queries: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(control cell, level) for each query cell; the source is known to have at least one control."""
    return draw_controls(*control_pools(ctx, queries), rng)


def rank_within(groups: np.ndarray) -> np.ndarray:
    """0,1,2,... within runs of equal values of a sorted array."""
    if groups.size == 0:
        return groups.astype(np.int64)
    starts = np.r_[0, np.flatnonzero(np.diff(groups)) + 1]
    sizes = np.diff(np.r_[starts, groups.size])
    return np.arange(groups.size) - np.repeat(starts, sizes)


def make_pairs(ctx: MatchContext, cond_id: np.ndarray, max_per_condition: int,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """[P,2] (control, perturbed) local cell ids, at most `max_per_condition` per (split, condition); levels."""
    pert = np.flatnonzero(~ctx.is_control)
    r = rng.random(pert.size)
    order = np.lexsort((r, cond_id[pert], ctx.split[pert]))
    groups = combine(ctx.split[pert][order], cond_id[pert][order])
    chosen = np.sort(pert[order][rank_within(groups) < max_per_condition])
    ctrl, level = match_controls(ctx, chosen, rng)
    return np.stack([ctrl, chosen], axis=1), level


def make_sentences(ctx: MatchContext, perturbation: np.ndarray, batch: np.ndarray, size: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sentences of `size` perturbed cells of one (shard, cell type, perturbation, batch) group.

    Every cell of a group appears in its sentences; the last sentence is topped up by draws with replacement
    from the group (so a short group yields one sentence sampled with replacement). Returns pert [S,L],
    matched ctrl [S,L] (an independent control draw per slot) and the control levels [S,L].
    """
    pert = np.flatnonzero(~ctx.is_control)
    if pert.size == 0:
        empty = np.zeros((0, size), np.int64)
        return empty, empty, empty.astype(np.int8)
    key = combine(ctx.home[pert], ctx.split[pert], ctx.cell_type[pert], perturbation[pert], batch[pert])
    order = np.lexsort((rng.random(pert.size), key))
    cells, key = pert[order], key[order]
    starts = np.r_[0, np.flatnonzero(np.diff(key)) + 1]
    n_g = np.diff(np.r_[starts, key.size])
    slots_g = -(-n_g // size) * size
    g = np.repeat(np.arange(n_g.size), slots_g)
    t = np.arange(g.size) - np.repeat(np.cumsum(slots_g) - slots_g, slots_g)
    n = n_g[g]
    offset = np.where(t < n, t, (rng.random(g.size) * n).astype(np.int64))
    slot_cells = cells[starts[g] + offset]
    # all slots of a sentence share shard, split, cell type and batch, hence one control pool per sentence
    level, lo, cnt, pools = control_pools(ctx, slot_cells[::size])
    ctrl, names = draw_controls(np.repeat(level, size), np.repeat(lo, size), np.repeat(cnt, size), pools, rng)
    return slot_cells.reshape(-1, size), ctrl.reshape(-1, size), names.reshape(-1, size)
