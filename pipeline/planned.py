"""What the build does with a plan before its shards are packed: park the planned columns, write
the condition table, and the pack settings its tasks share. Shared by the serial build
(:mod:`pipeline.build`) and the pipelined one (:mod:`pipeline.pipelined`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from loaders import format as fmt
from pipeline.manifest import Manifest
from pipeline.model import Kind, KindPlan, PackConfig, ShardPlan
from pipeline.shardfile import shard_suffix, write_columns
from pipeline.writers import Codec


def pack_config(
    manifest: Manifest,
    kind: Kind,
    plan: KindPlan,
    out: Path,
    spill: Path,
    remote: bool,
    jobs: int,
    whole_sources: bool = False,
) -> PackConfig:
    """The settings every pack task of this build gets (``remote``: a cluster backend, whose
    reruns need the spill files kept until the build ends)."""
    return PackConfig(
        out=out.resolve(),
        spill=spill,
        encoding=manifest.format,
        codec=Codec(manifest.codec, manifest.codec_level),
        fields=plan.fields,
        block_rows=manifest.block_rows,
        tables=tuple(plan.tables),
        samples=tuple(kind.samples),
        drop_spill=not remote,
        jobs=jobs,
        whole_sources=whole_sources,
        options=kind.pack_options(manifest),
    )


def park_tables(spill: Path, reused: set[str], names: tuple[str, ...], shard: ShardPlan) -> None:
    """Keep the plan's memory small: a new shard's big planned columns (``names``: the kind's
    ``parked``; a name ending in "/" stands for every column under it) wait in the spill folder
    as .npy files (its pack task loads them and lets them go); a reused shard's columns are not
    needed at all."""
    if shard.key in reused:
        shard.columns.clear()
        return
    for name in [
        c
        for c in shard.columns
        if any(c == n or (n.endswith("/") and c.startswith(n)) for n in names)
    ]:
        a = shard.columns.get(name)
        if isinstance(a, np.ndarray) and a.nbytes > 1 << 16:
            path = (
                spill
                / f"plan-{shard.source}-{shard.split}-{shard.part}-{name.replace('/', '~')}.npy"
            )
            np.save(path, a, allow_pickle=False)
            shard.columns[name] = path


def conditions_file(plan: KindPlan, cfg: PackConfig) -> str:
    """The condition table's file name, from its content (so a rebuild with equal vectors reuses
    it)."""
    columns = plan.conditions or {}
    h = hashlib.sha256()
    for key in (
        fmt.CONDITION_VECTORS,
        fmt.CONDITION_CODES,
    ):  # same digest as of the bytes joined, no copies
        if key in columns:
            h.update(np.ascontiguousarray(columns[key]))
    return f"conditions-{h.hexdigest()[:16]}{shard_suffix(cfg)}"


def write_conditions(out: Path, plan: KindPlan, cfg: PackConfig, name: str) -> fmt.ConditionsRef:
    """The condition table beside index.json, as ``name`` (`conditions_file`)."""

    columns = plan.conditions or {}
    final = out / name
    digest, stored = write_columns(columns, final, cfg)
    vectors = columns[fmt.CONDITION_VECTORS]
    return fmt.ConditionsRef(
        file=final.name,
        rows=int(vectors.shape[0]),
        dim=int(vectors.shape[1]),
        digest=digest,
        bytes=stored,
        segments=list(plan.condition_segments),
    )
