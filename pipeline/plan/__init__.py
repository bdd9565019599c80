"""Stage 2: the plan, a pure function of (manifest, seed, scanned sources).

Shards hold the rows of one source and one split, so a changed source rewrites only its own shards, and
pairs and sentences (matched within a source) never cross a shard. Random draws come from per-source
generators: changing one source leaves every other source's plan, and so its shards, byte-identical.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from loaders import format as fmt
from pipeline.manifest import Manifest
from pipeline.plan.cells import CellTable, build_cell_table
from pipeline.plan.conditions import ConditionTable, build_conditions, load_features
from pipeline.plan.pairing import LEVELS, MatchContext, make_pairs, make_sentences
from pipeline.plan.splits import SPLIT_NAMES, assign_splits, source_rng
from pipeline.scan import ScannedSource

__all__ = ["Plan", "ShardPlan", "make_plan"]


@dataclass
class ShardPlan:
    split: str
    source: int
    part: int  # shard number within its (source, split)
    rows: np.ndarray  # int64 source rows, in shard order (pre-shuffled)
    columns: dict[str, np.ndarray]  # every column except the matrix and obsm, which pack reads from the source
    key: str = ""

    @property
    def file(self) -> str:
        return f"{self.split}-{self.source:03d}-{self.part:03d}-{self.key[:16]}"

    @property
    def n(self) -> int:
        return int(self.rows.size)


@dataclass
class Plan:
    cells: CellTable
    conditions: ConditionTable
    shards: list[ShardPlan]
    stats: dict[str, object] = field(default_factory=dict)


def _bytes_per_cell(src: ScannedSource, rows: np.ndarray, n_codes: int, obsm_width: int) -> float:
    nnz = float(src.meta.row_nnz[rows].mean()) if rows.size else 0.0
    return nnz * 8.0 + 8 + 8 + 1 + 4 * (n_codes + 1) + 4 * obsm_width




def plan_source(manifest: Manifest, src: ScannedSource, cells: CellTable, idx: np.ndarray, split: np.ndarray,
                cond: ConditionTable) -> tuple[list[ShardPlan], dict[str, int]]:
    """Shards, pairs and sentences of one source; `idx` are its rows in the cell table."""
    seed, s = manifest.seed, src.ordinal
    fields = manifest.fields.obs_fields
    obsm_width = sum(int(np.prod(src.meta.obsm[k][0][1:])) for k in manifest.fields.obsm)
    cap_bytes = manifest.shard_size_mb * (1 << 20)
    sp = split[idx]
    home = np.zeros(idx.size, np.int64)
    parts: list[tuple[int, int]] = []  # (split, part) per local shard number
    for k in range(len(SPLIT_NAMES)):
        members = np.flatnonzero(sp == k)
        if members.size == 0:
            continue
        per_cell = _bytes_per_cell(src, cells.row[idx[members]], len(fields), obsm_width)
        n_shards = max(1, int(np.ceil(members.size * per_cell / cap_bytes)))
        perm = source_rng(seed, s, 10 + k).permutation(members.size)
        home[members[perm]] = len(parts) + np.arange(members.size) * n_shards // members.size
        parts.extend((k, p) for p in range(n_shards))

    codes = {f: cells.codes[f][idx] for f in fields}
    batch = codes["batch"] if "batch" in codes else np.zeros(idx.size, np.int32)
    ctx = MatchContext(home, sp, codes["cell_type"],
                       batch if manifest.pairing.strategy == "batch" else np.zeros_like(batch),
                       cells.is_control[idx])
    cond_id = cond.cond_id[idx]
    rng = source_rng(seed, s, 20)
    pairs, pair_level = make_pairs(ctx, cond_id, manifest.pairing.max_pairs_per_condition, rng)
    sent_p, sent_c, sent_level = make_sentences(ctx, codes["perturbation"], batch, manifest.pairing.sentence_size, rng)
    stats = {f"pairs_{lv}": int((pair_level == i).sum()) for i, lv in enumerate(LEVELS)}
    stats.update({f"sentence_slots_{lv}": int((sent_level == i).sum()) for i, lv in enumerate(LEVELS)})

    pair_home = home[pairs[:, 1]]
    sent_home = home[sent_p[:, 0]] if sent_p.size else np.zeros(0, np.int64)
    shards: list[ShardPlan] = []
    duplicates = 0
    for local, (k, part) in enumerate(parts):
        primary = np.flatnonzero(home == local)
        pr = pairs[pair_home == local]
        sc, spp = sent_c[sent_home == local], sent_p[sent_home == local]
        wanted = np.zeros(idx.size, bool)
        wanted[pr[:, 0]] = True
        wanted[sc.ravel()] = True
        wanted[primary] = False
        dups = np.flatnonzero(wanted)
        duplicates += int(dups.size)
        members = np.concatenate([primary, dups])
        order = source_rng(seed, s, 1000 + local).permutation(members.size)
        members = members[order]
        is_primary = np.concatenate([np.ones(primary.size, bool), np.zeros(dups.size, bool)])[order]
        lut = np.full(idx.size, -1, np.int32)  # source cell -> local row
        lut[members] = np.arange(members.size, dtype=np.int32)
        g = idx[members]
        columns = {
            fmt.SAMPLE_ID: cells.sample_id[g],
            fmt.PRIMARY: is_primary,
            fmt.COND_ID: cond.cond_id[g],
            **{fmt.OBS_PREFIX + f: cells.codes[f][g] for f in fields},
            fmt.PAIRS: lut[pr].reshape(-1, 2),
            fmt.SENTENCES_PERT: lut[spp].reshape(-1, manifest.pairing.sentence_size),
            fmt.SENTENCES_CTRL: lut[sc].reshape(-1, manifest.pairing.sentence_size),
        }
        shards.append(ShardPlan(SPLIT_NAMES[k], s, part, cells.row[g], columns))
    stats["duplicated_controls"] = duplicates
    return shards, stats


def plan_key(shard: ShardPlan, src: ScannedSource, manifest: Manifest) -> str:
    """Hash of everything a shard's bytes depend on: source content, config, format version, planned columns."""
    h = hashlib.sha256()
    config = {"format": fmt.FORMAT_VERSION, "encoding": manifest.format, "codec": [manifest.codec, manifest.codec_level],
              "source": src.fingerprint.sha256, "matrix": src.spec.matrix, "values": manifest.fields.values,
              "obsm": list(manifest.fields.obsm)}
    h.update(json.dumps(config, sort_keys=True).encode())
    for name, a in [("rows", shard.rows), *sorted(shard.columns.items())]:
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def make_plan(manifest: Manifest, scanned: Sequence[ScannedSource]) -> Plan:
    cells = build_cell_table(manifest, scanned)
    split = assign_splits(cells, manifest)
    fields = manifest.fields.obs_fields
    features = None
    if manifest.fields.perturbation_features is not None:
        features = load_features(manifest.fields.perturbation_features, cells.vocabularies["perturbation"],
                                 manifest.fields.control)
    cond = build_conditions(cells.codes, fields, cells.vocabularies, features)
    order = np.argsort(cells.source, kind="stable")
    bounds = np.searchsorted(cells.source[order], np.arange(len(scanned) + 1))
    shards: list[ShardPlan] = []
    stats: dict[str, object] = {"dropped": dict(cells.dropped)}
    totals: dict[str, int] = {}
    for src in scanned:
        idx = order[bounds[src.ordinal]:bounds[src.ordinal + 1]]
        src_shards, src_stats = plan_source(manifest, src, cells, idx, split, cond)
        for sh in src_shards:
            sh.key = plan_key(sh, src, manifest)
        shards.extend(src_shards)
        for k, v in src_stats.items():
            totals[k] = totals.get(k, 0) + v
    stats["pairing"] = totals
    stats["cells_per_split"] = {n: int((split == i).sum()) for i, n in enumerate(SPLIT_NAMES)}
    return Plan(cells, cond, shards, stats)
