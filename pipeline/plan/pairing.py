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


def combine(*cols: np.ndarray) -> np.ndarray:
    """Pack integer columns into one int64 key that sorts like the tuple."""
    key = np.zeros(cols[0].shape, np.int64)
    for c in cols:
        c = c.astype(np.int64)
        key = key * (int(c.max(initial=0)) + 1) + c
    return key


def pick_from_groups(query_keys: np.ndarray, pool_keys: np.ndarray, pool_ids: np.ndarray,
                     u: np.ndarray) -> np.ndarray:
    """For each query, a uniformly chosen pool id with the same key (u in [0,1)), or -1 if none."""
    order = np.argsort(pool_keys, kind="stable")
    sk = pool_keys[order]
    lo = np.searchsorted(sk, query_keys, "left")
    hi = np.searchsorted(sk, query_keys, "right")
    cnt = hi - lo
    choice = np.minimum(lo + (u * cnt).astype(np.int64), np.maximum(hi - 1, 0))
    out = np.full(query_keys.shape, -1, np.int64)
    has = cnt > 0
    out[has] = pool_ids[order[choice[has]]]
    return out


@dataclass(frozen=True)
class MatchContext:
    """Per-cell columns of one source (local cell indices 0..n-1)."""

    home: np.ndarray  # int64 shard of each cell
    split: np.ndarray  # int8
    cell_type: np.ndarray  # int32
    batch: np.ndarray  # int32 (zeros when the strategy ignores batch)
    is_control: np.ndarray  # bool

    def level_keys(self) -> list[tuple[int, np.ndarray]]:
        ct, b, h, sp = self.cell_type, self.batch, self.home, self.split
        zero = np.zeros_like(h)
        return [(0, combine(h, ct, b)), (0, combine(sp, ct, b)), (1, combine(h, ct)), (1, combine(sp, ct)),
                (2, combine(h)), (2, combine(sp)), (3, zero)]


def match_controls(ctx: MatchContext, queries: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(control cell, level) for each query cell; the source is known to have at least one control."""
    pool = np.flatnonzero(ctx.is_control)
    ctrl = np.full(queries.shape, -1, np.int64)
    level = np.full(queries.shape, -1, np.int8)
    u = rng.random(queries.shape)
    for lvl, key in ctx.level_keys():
        todo = ctrl < 0
        if not todo.any():
            break
        got = pick_from_groups(key[queries[todo]], key[pool], pool, u[todo])
        idx = np.flatnonzero(todo)[got >= 0]
        ctrl[idx] = got[got >= 0]
        level[idx] = lvl
    return ctrl, level


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
    key = combine(ctx.home[pert], ctx.cell_type[pert], perturbation[pert], batch[pert])
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
    ctrl, level = match_controls(ctx, slot_cells, rng)
    return slot_cells.reshape(-1, size), ctrl.reshape(-1, size), level.reshape(-1, size)
