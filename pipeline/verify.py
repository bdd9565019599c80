"""Stage 5: verify a committed dataset: hashes, schema, counts and references. `inspect` summarises it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from loaders import format as fmt
from loaders.shardio import read_shard


def verify(root: str | Path, check_hashes: bool = True) -> list[str]:
    """Every problem found, as a message naming the shard; an empty list means the dataset is sound."""
    problems: list[str] = []
    try:
        index = fmt.read_index(root)
    except fmt.FormatError as e:
        return [str(e)]
    keys = fmt.shard_keys(index.fields, index.tables)
    vocab_sizes = {f: len(v) for f, v in index.vocabularies.items()}
    n_cond = int((index.conditions or {}).get("n", 0))
    seen: list[np.ndarray] = []
    cond = index.conditions
    if cond is not None:
        cpath = index.root / cond["file"]
        if not cpath.exists():
            problems.append(f"{cpath}: condition table missing")
        elif check_hashes and fmt.content_hash(cpath) != cond["sha256"]:
            problems.append(f"{cpath}: content hash mismatch")
    for entry in index.shards:
        path = index.shard_path(entry)
        try:
            if check_hashes and fmt.content_hash(path) != entry.sha256:
                problems.append(f"{path}: content hash mismatch (index says {entry.sha256[:12]}…)")
                continue
            cols = read_shard(path, index.encoding, keys)
            n = fmt.validate_columns(cols, index.fields, name=str(path))
        except fmt.FormatError as e:
            problems.append(str(e))
            continue
        counts = {"records": n, "primary": int(cols[fmt.PRIMARY].sum()), "pairs": cols[fmt.PAIRS].shape[0],
                  "sentences": cols[fmt.SENTENCES_PERT].shape[0]}
        for k, v in counts.items():
            if getattr(entry, k) != v:
                problems.append(f"{path}: index says {k}={getattr(entry, k)}, shard has {v}")
        for f, size in vocab_sizes.items():
            c = cols.get(fmt.OBS_PREFIX + f)
            if c is not None and c.size and (c.min() < 0 or c.max() >= size):
                problems.append(f"{path}: obs/{f} codes outside the vocabulary of {size}")
        cid = cols[fmt.COND_ID]
        if cid.size and (cid.min() < 0 or cid.max() >= n_cond):
            problems.append(f"{path}: cond_id outside the condition table of {n_cond}")
        ctrl = set(index.raw.get("control_labels", []))
        pert_vocab = index.vocabularies.get("perturbation", [])
        is_ctrl = np.isin(cols.get(fmt.OBS_PREFIX + "perturbation", np.zeros(0, np.int32)),
                          [pert_vocab.index(c) for c in ctrl])
        pairs = cols[fmt.PAIRS]
        if pairs.size and not (is_ctrl[pairs[:, 0]].all() and not is_ctrl[pairs[:, 1]].any()):
            problems.append(f"{path}: a pair does not join a control to a perturbed cell")
        if cols[fmt.SENTENCES_CTRL].size and not is_ctrl[cols[fmt.SENTENCES_CTRL]].all():
            problems.append(f"{path}: a control sentence holds a perturbed cell")
        seen.append(cols[fmt.SAMPLE_ID][cols[fmt.PRIMARY]])
    if seen:
        ids = np.concatenate(seen)
        if np.unique(ids).size != ids.size:
            problems.append(f"{root}: a sample_id is primary in more than one place")
        expected = index.raw.get("stats", {}).get("cells")
        if expected is not None and ids.size != expected:
            problems.append(f"{root}: {ids.size} primary records, the plan had {expected} cells")
    return problems


def summary(root: str | Path) -> dict[str, Any]:
    index = fmt.read_index(root)
    splits: dict[str, dict[str, int]] = {}
    for e in index.shards:
        s = splits.setdefault(e.split, {"shards": 0, "records": 0, "cells": 0, "pairs": 0, "sentences": 0,
                                        "bytes": 0, "raw_bytes": 0})
        for k, v in (("shards", 1), ("records", e.records), ("cells", e.primary), ("pairs", e.pairs),
                     ("sentences", e.sentences), ("bytes", e.bytes), ("raw_bytes", e.raw_bytes)):
            s[k] += v
    total_bytes = sum(e.bytes for e in index.shards)
    raw = sum(e.raw_bytes for e in index.shards)
    stats = index.raw.get("stats", {})
    return {
        "name": index.name, "kind": index.kind, "encoding": index.encoding, "codec": index.raw.get("codec"),
        "splits": splits, "vocabulary_sizes": {f: len(v) for f, v in index.vocabularies.items()},
        "genes": index.field(fmt.X).shape[0] if any(f.name == fmt.X for f in index.fields) else None,
        "conditions": (index.conditions or {}).get("n"), "bytes": total_bytes, "raw_bytes": raw,
        "compression_ratio": round(raw / total_bytes, 3) if total_bytes else None,
        "pairing": stats.get("pairing", {}), "dropped": stats.get("dropped", {}),
        "sources": len(index.raw.get("sources", [])), "source_rows": stats.get("source_rows"),
    }


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"{s['name']} ({s['kind']}, {s['encoding']} {s['codec']['name'] if s['codec'] else ''}): "
             f"{s['sources']} sources, {s['source_rows']} source rows, {s['genes']} genes, {s['conditions']} conditions"]
    lines.append(f"  {'split':6} {'shards':>6} {'cells':>9} {'stored':>9} {'pairs':>8} {'sentences':>9} {'MB':>8}")
    for name, v in s["splits"].items():
        lines.append(f"  {name:6} {v['shards']:6d} {v['cells']:9d} {v['records']:9d} {v['pairs']:8d} "
                     f"{v['sentences']:9d} {v['bytes'] / 1e6:8.2f}")
    lines.append(f"  vocabularies: {', '.join(f'{k}={v}' for k, v in s['vocabulary_sizes'].items())}")
    lines.append(f"  bytes: {s['bytes'] / 1e6:.2f} MB stored, {s['raw_bytes'] / 1e6:.2f} MB raw "
                 f"(compression ratio {s['compression_ratio']})")
    lines.append("  pairing: " + ", ".join(f"{k}={v}" for k, v in s["pairing"].items()))
    if s["dropped"]:
        lines.append("  dropped: " + ", ".join(f"{k}={v}" for k, v in s["dropped"].items()))
    return "\n".join(lines)
