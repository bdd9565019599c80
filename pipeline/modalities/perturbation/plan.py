"""Stage 2: the plan, a pure function of (manifest, seed, scanned sources).

Shards hold the rows of one source and one split, so a changed source rewrites only its own
shards, and pairs and sentences (matched within a source) never cross a shard. Random draws come
from per-source generators: changing one source leaves every other source's plan, and so its
shards, byte-identical.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from loaders import format as fmt
from pipeline.manifest import Manifest
from pipeline.modalities.perturbation.cells import CellTable, build_cell_table
from pipeline.modalities.perturbation.conditions import (
    ConditionTable,
    VectorOptions,
    build_conditions,
    load_features,
    split_combinations,
)
from pipeline.modalities.perturbation.keys import plan_key, source_key
from pipeline.modalities.perturbation.matrix import source_obs_names
from pipeline.modalities.perturbation.obs_names import obs_name_columns
from pipeline.modalities.perturbation.pairing import (
    AWAY,
    LEVELS,
    ControlPools,
    MatchContext,
    combine,
    group_counts,
    make_pairs,
    sentence_picks,
    stable_argsort,
)
from pipeline.modalities.perturbation.splits import (
    DROPPED,
    SPLIT_NAMES,
    assign_splits,
    control_split,
)
from pipeline.model import ScannedSource, ShardPlan
from pipeline.seeding import source_rng

__all__ = ["Park", "Plan", "PlanTables", "ShardPlan", "make_plan", "plan_sources", "source_key"]


Park = Callable[[ShardPlan], None]


@dataclass
class Plan:
    cells: CellTable
    conditions: ConditionTable
    shards: list[ShardPlan]
    stats: dict[str, object] = field(default_factory=dict)
    source_keys: list[str] = field(default_factory=list)  # per source, see source_key
    source_stats: list[dict[str, int]] = field(
        default_factory=list
    )  # per source, summed into stats["pairing"]


def _bytes_per_cell(src: ScannedSource, rows: np.ndarray, n_codes: int, obsm_width: int) -> float:
    nnz = float(src.meta.row_nnz[rows].mean()) if rows.size else 0.0
    return nnz * 8.0 + 8 + 8 + 1 + 4 * (n_codes + 1) + 4 * obsm_width


GATHER_ROWS = 2048  # slot-table rows gathered per step (~1 MB of int32 slots)


def _gather(values: np.ndarray, index: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``values[index]`` into ``out`` for a slot table, a block of rows at a time (numpy widens an
    int32 index to intp first: a whole table's widened copy, 8 bytes a slot, cost more than the
    gather). The plan passes the picks as both: used once, so no second table in its peak."""
    for a in range(0, index.shape[0], GATHER_ROWS):
        np.take(values, index[a : a + GATHER_ROWS], out=out[a : a + GATHER_ROWS])
    return out


def _slices(owner: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A stable order grouping items by owner (0..n-1) and the n+1 bounds of each owner's slice."""
    order = stable_argsort(owner)
    return order, np.searchsorted(owner[order], np.arange(n + 1))


def plan_source(
    manifest: Manifest,
    src: ScannedSource,
    cells: CellTable,
    idx: np.ndarray,
    split: np.ndarray,
    cond: ConditionTable,
    park: Park | None = None,
    pool_split: np.ndarray | None = None,
) -> tuple[list[ShardPlan], dict[str, int]]:
    """Shards, pairs and sentences of one source; `idx` are its rows in the cell table. Each shard
    is keyed and handed to `park` as soon as it is planned (see make_plan). `pool_split`: see
    splits.control_split. Stats: pairing levels, plus "check_*" counts that feed the build's
    warnings (pipeline.modalities.perturbation.plan.checks)."""
    # one source's barcodes (scan.compact_meta), read first: its temporaries meet no pairing's
    names = source_obs_names(src)
    seed, s = manifest.seed, src.ordinal
    fields = manifest.config.fields.obs_fields
    obsm_width = sum(int(np.prod(src.meta.obsm[k][0][1:])) for k in manifest.config.fields.obsm)
    cap_bytes = manifest.shard_size_mb * (1 << 20)
    sp = split[idx]
    home = np.zeros(idx.size, np.int64)
    parts: list[tuple[int, int]] = []  # (split, part) per local shard number
    for k in range(len(SPLIT_NAMES)):
        members = np.flatnonzero(sp == k)
        if members.size == 0:
            continue
        per_cell = _bytes_per_cell(src, cells.row[idx[members]], len(fields), obsm_width)
        # never more shards than cells: a tiny shard_size_mb must not plan empty shards (or millions
        # of them)
        n_shards = min(members.size, max(1, int(np.ceil(members.size * per_cell / cap_bytes))))
        perm = source_rng(seed, s, 10 + k).permutation(members.size)
        home[members[perm]] = len(parts) + np.arange(members.size) * n_shards // members.size
        parts.extend((k, p) for p in range(n_shards))

    codes = {f: cells.codes32(f, idx) for f in fields}
    batch = codes["batch"] if "batch" in codes else np.zeros(idx.size, np.int32)
    cell_type = codes["cell_type"] if "cell_type" in codes else np.zeros(idx.size, np.int32)
    ctx = MatchContext(
        home,
        sp,
        cell_type,
        batch if manifest.config.pairing.strategy == "batch" else np.zeros_like(batch),
        cells.is_control[idx],
        None if pool_split is None else pool_split[idx],
    )
    pools = ControlPools(ctx)
    pairs, pair_level = make_pairs(
        ctx,
        cond.cond_id[idx].astype(np.int32),
        manifest.config.pairing.max_pairs_per_condition,
        source_rng(seed, s, 20),
        pools,
    )
    stats = {f"pairs_{lv}": int((pair_level == i).sum()) for i, lv in enumerate(LEVELS)}
    stats.update(
        group_checks(ctx, codes["perturbation"], pairs, manifest.config.pairing.sentence_size)
    )
    slot_levels = np.zeros(len(LEVELS), np.int64)
    size = manifest.config.pairing.sentence_size
    # One stable sort per table instead of a mask over every cell per shard (quadratic in shards):
    # each shard's cells and pairs are contiguous slices, in the order the masks gave.
    by_home, cell_bounds = _slices(home, len(parts))
    pair_order, pair_bounds = _slices(home[pairs[:, 1]], len(parts))
    pairs = pairs[pair_order]
    shards: list[ShardPlan] = []
    duplicates = 0
    wanted = np.zeros(idx.size, bool)  # scratch, reset after each shard: O(shard) work per shard
    lut = np.full(idx.size, -1, np.int32)  # source cell -> local row, reset likewise
    for local, (k, part) in enumerate(parts):
        primary = by_home[cell_bounds[local] : cell_bounds[local + 1]]
        pr = pairs[pair_bounds[local] : pair_bounds[local + 1]]
        # Sentence groups never cross a shard, so a shard's slot tables (the plan's biggest arrays,
        # ~40 slots per perturbed cell) are drawn here, one shard at a time, from a per-shard
        # generator.
        sent = sentence_picks(
            ctx,
            codes["perturbation"],
            batch,
            size,
            source_rng(seed, s, 2000 + local),
            pools,
            cells=primary[~ctx.is_control[primary]],
        )
        slot_levels += np.bincount(sent.level, minlength=len(LEVELS)) * size
        stats[f"check_sentences_{SPLIT_NAMES[k]}"] += int(sent.pert.shape[0])
        # the controls the sentences take from beyond the shard, marked over the pools (small)
        used = np.zeros(pools.every.size, bool)
        used[sent.ctrl[AWAY[sent.pool]]] = True
        wanted[pr[:, 0]] = True
        wanted[pools.every[used]] = True
        wanted[primary] = False
        dups = np.flatnonzero(wanted)
        wanted[dups] = False
        duplicates += int(dups.size)
        members = np.concatenate([primary, dups])
        order = source_rng(seed, s, 1000 + local).permutation(members.size)
        members = members[order]
        is_primary = np.concatenate([np.ones(primary.size, bool), np.zeros(dups.size, bool)])[order]
        lut[members] = np.arange(members.size, dtype=np.int32)
        g = idx[members]
        rows = cells.row[g]  # int32 (the cell table's): every shard's rows wait until packed
        columns = {
            fmt.SAMPLE_ID: cells.sample_ids(g),
            fmt.PRIMARY: is_primary,
            fmt.COND_ID: cond.cond_id[g].astype(np.int32),
            **obs_name_columns(names, rows),
            **{fmt.OBS_PREFIX + f: cells.codes32(f, g) for f in fields},
            fmt.PAIRS: lut[pr].reshape(-1, 2),
            # one gather per slot table: shard rows of the sentence cells, then of the picks
            fmt.SENTENCES_PERT: _gather(lut[sent.cells], sent.pert, out=sent.pert),
            fmt.SENTENCES_CTRL: _gather(lut[pools.every32], sent.ctrl, out=sent.ctrl),
        }
        del sent  # its tables are the columns now: parked below, not held while the next is drawn
        lut[members] = -1
        shard = ShardPlan(SPLIT_NAMES[k], s, part, rows, columns)
        shard.key = plan_key(shard, src, manifest)
        if park is not None:
            park(shard)
        shards.append(shard)
    stats.update({f"sentence_slots_{lv}": int(slot_levels[i]) for i, lv in enumerate(LEVELS)})
    stats["duplicated_controls"] = duplicates
    return shards, stats


def group_checks(
    ctx: MatchContext, perturbation: np.ndarray, pairs: np.ndarray, size: int
) -> dict[str, int]:
    """Counts behind the build's warnings for one source: pairs per split (sentences are added per
    shard), and (split, cell type, perturbation) groups with fewer perturbed cells than a
    sentence."""
    out = {
        f"check_pairs_{n}": int(c)
        for n, c in zip(
            SPLIT_NAMES,
            np.bincount(ctx.split[pairs[:, 1]], minlength=len(SPLIT_NAMES)),
            strict=True,
        )
    }
    out.update({f"check_sentences_{n}": 0 for n in SPLIT_NAMES})
    pert = np.flatnonzero(~ctx.is_control)
    counts = group_counts(combine(ctx.split[pert], ctx.cell_type[pert], perturbation[pert]))
    out["check_perturbation_groups"] = int(counts.size)
    out["check_short_perturbation_groups"] = int((counts < size).sum())
    return out


@dataclass
class PlanTables:
    """The dataset-wide part of the plan, made before any source is planned: the cell table, the
    splits, the condition table and where each source's cells lie in the cell table."""

    cells: CellTable
    split: np.ndarray
    pool_split: np.ndarray | None
    cond: ConditionTable
    digest: str  # of the vocabularies and condition codes (see source_key)
    order: np.ndarray | None  # None: the cell table lists sources in order
    bounds: np.ndarray


def plan_tables(manifest: Manifest, scanned: Sequence[ScannedSource]) -> PlanTables:
    """The dataset-wide tables (cheap beside the per-source plans, ~0.3 of ~2.3 s at 2M cells)."""
    cells = build_cell_table(manifest, scanned)
    split = assign_splits(cells, manifest, [s.spec.path for s in scanned])
    if (split == DROPPED).any():
        keep = split != DROPPED
        cells, split = cells.subset(keep, "not used by the cell-load experiment"), split[keep]
    pool_split = control_split(manifest, split)
    cfg = manifest.config.fields
    opts = VectorOptions(
        cfg.combination_separator,
        cfg.control,
        cfg.numeric_covariates,
        cfg.numeric_transform,
        str(manifest.path),
    )
    features = None
    if cfg.perturbation_features is not None:
        names = cells.vocabularies["perturbation"]
        if cfg.combination_separator is not None:  # features are per single perturbation
            names = split_combinations(names, cfg.combination_separator, cfg.control)[0]
        features = load_features(cfg.perturbation_features, names, cfg.control)
    cond = build_conditions(cells.codes, cfg.obs_fields, cells.vocabularies, features, opts)
    tables = hashlib.sha256(json.dumps(cells.vocabularies, sort_keys=True).encode())
    tables.update(f"{cond.codes.dtype.str}{cond.codes.shape}".encode())
    tables.update(np.ascontiguousarray(cond.codes))
    # the cell table lists sources in order (build_cell_table fills it source by source): a source's
    # cells are a slice, so no per-cell sort order is held while planning (8 bytes a cell); any
    # other order is sorted
    grouped = bool((cells.source[1:] >= cells.source[:-1]).all())
    order = None if grouped else np.argsort(cells.source, kind="stable")
    bounds = np.searchsorted(
        cells.source if order is None else cells.source[order], np.arange(len(scanned) + 1)
    )
    return PlanTables(cells, split, pool_split, cond, tables.hexdigest(), order, bounds)


def plan_sources(
    manifest: Manifest,
    scanned: Sequence[ScannedSource],
    t: PlanTables,
    park: Park | None = None,
    known: Mapping[str, tuple[list[ShardPlan], dict[str, int]]] | None = None,
    salt: str = "",
) -> Iterator[tuple[str, list[ShardPlan], dict[str, int]]]:
    """(source key, shards, stats) of each source in turn, each planned only when asked for: a
    pipelined build packs a source's shards while the next source is planned."""
    # a pipelined build wrote the condition vectors (27 MB at 2M cells) before it asks for a
    # source: the table keeps no copy beside the per-source temporaries (ConditionTable)
    t.cond.drop_vectors()
    offset = 0
    for src in scanned:
        key = source_key(manifest, src, offset, t.digest, salt)
        offset += src.meta.n_rows
        if known is not None and key in known:
            yield key, *known[key]
            continue
        lo, hi = int(t.bounds[src.ordinal]), int(t.bounds[src.ordinal + 1])
        idx = np.arange(lo, hi, dtype=np.int64) if t.order is None else t.order[lo:hi]
        yield key, *plan_source(manifest, src, t.cells, idx, t.split, t.cond, park, t.pool_split)


def plan_stats(t: PlanTables, per_source: Sequence[Mapping[str, int]]) -> dict[str, object]:
    """The plan's stats once every source is planned: pairing levels and the warnings' counts
    summed over the sources, cells per split, and the dropped cells."""
    totals: dict[str, int] = {}
    for src_stats in per_source:
        for k, v in src_stats.items():
            totals[k] = totals.get(k, 0) + v
    return {
        "dropped": dict(t.cells.dropped),
        "pairing": {k: v for k, v in totals.items() if not k.startswith("check_")},
        "checks": {
            k.removeprefix("check_"): v for k, v in totals.items() if k.startswith("check_")
        },
        "cells_per_split": {n: int((t.split == i).sum()) for i, n in enumerate(SPLIT_NAMES)},
    }


def make_plan(
    manifest: Manifest,
    scanned: Sequence[ScannedSource],
    park: Park | None = None,
    known: Mapping[str, tuple[list[ShardPlan], dict[str, int]]] | None = None,
    salt: str = "",
) -> Plan:
    """The whole plan. `park(shard)` is called with every shard right after it is keyed, so the
    caller can move its big columns out of memory (or drop them when the shard is reused): the
    plan then holds only per-cell arrays, whatever the number of shards.

    `known` maps source keys (see `source_key`) of an earlier build to that source's shards
    (stubs: keys and names) and stats; a source whose key is known is not planned again. The
    dataset-wide tables are always rebuilt, since any source can change them and with them every
    other source's codes."""
    t = plan_tables(manifest, scanned)
    shards: list[ShardPlan] = []
    keys, per_source = [], []
    for key, src_shards, src_stats in plan_sources(manifest, scanned, t, park, known, salt):
        keys.append(key)
        per_source.append(src_stats)
        shards.extend(src_shards)
    return Plan(t.cells, t.cond, shards, plan_stats(t, per_source), keys, per_source)
