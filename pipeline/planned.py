"""What the build does with a plan before its shards are packed: park the planned columns, write
the condition table, and the pack settings its tasks share. Shared by the serial build
(:mod:`pipeline.build`) and the pipelined one (:mod:`pipeline.pipelined`)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import BinaryIO

import numpy as np

from loaders import format as fmt
from pipeline.buffers import Scratch
from pipeline.manifest import Manifest
from pipeline.model import Kind, KindPlan, PackConfig, ShardPlan
from pipeline.shardfile import shard_suffix, write_columns
from pipeline.writers import Codec

NARROWED = ".u16.npy"  # a parked column saved as uint16 (`park_column`); its dtype before it
WIDE = 1 << 16  # integer columns whose values are all below this are parked narrowed
PARKED = "parked-"  # `load_column`'s scratch buffers
SLICE = 1 << 17  # values of a narrowed column widened at a time (256 KiB read)


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
            stem = f"plan-{shard.source}-{shard.split}-{shard.part}-{name.replace('/', '~')}"
            shard.columns[name] = park_column(spill / stem, a)


def park_column(stem: Path, a: np.ndarray) -> Path:
    """Save one planned column for its pack task (``.npy``, never pickled) at ``stem`` + a
    suffix. Integer columns whose values fit 16 bits (a shard's sentences and pairs: row numbers
    within the shard) are saved as uint16, their own dtype named in the suffix: these files are
    written to fresh page-cache pages, the dearest bytes a build writes here (~0.2 GB fewer at
    2M cells; docs/benchmarks/ANALYSIS.md, 26.3b)."""
    if a.dtype.kind in "iu" and a.dtype.itemsize > 2 and a.size and 0 <= a.min() <= a.max() < WIDE:
        path = stem.with_name(f"{stem.name}.{a.dtype.str[1:]}{NARROWED}")
        np.save(path, a.astype(np.uint16), allow_pickle=False)
        return path
    path = stem.with_name(stem.name + ".npy")
    np.save(path, a, allow_pickle=False)
    return path


def load_column(path: Path, name: str, scratch: Scratch) -> np.ndarray:
    """Column ``name`` of a shard, parked at ``path`` (`park_column`), read into this thread's
    buffer for that column name: valid until the next load of a column of the same name (the
    next shard's). Why not ``np.load``: a fresh array per shard was ~40% of a 2M-cell build's
    page faults (``perf record -e page-faults``). A narrowed column is widened a slice at a time,
    so only its final form is held."""
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = header(fh)
        if fortran or dtype.hasobject:
            raise RuntimeError(f"{path}: not a parked column (Fortran order or objects)")
        n = math.prod(shape)
        narrowed = path.name.endswith(NARROWED)
        wide = np.dtype(path.name[: -len(NARROWED)].rsplit(".", 1)[-1]) if narrowed else dtype
        out = scratch.get(f"{PARKED}{name}", wide, n)
        step = SLICE if narrowed else max(n, 1)
        for i in range(0, n, step):
            part = (
                out[i : i + step] if not narrowed else scratch.get(PARKED, dtype, min(step, n - i))
            )
            _read_exactly(fh, part, path)
            if narrowed:
                out[i : i + part.size] = part
    return out.reshape(shape)


def release_columns(scratch: Scratch) -> None:
    """Drop the thread's `load_column` buffers: a task that has packed its shards lets them go
    rather than hold them (~10 MB a thread) through the next source's read."""
    for name in [n for n in scratch.buffers if n.startswith(PARKED)]:
        del scratch.buffers[name]


def _read_exactly(fh: BinaryIO, into: np.ndarray, path: Path) -> None:
    view, got = memoryview(into).cast("B"), 0
    while got < into.nbytes and (k := fh.readinto(view[got:])):
        got += k
    if got != into.nbytes:
        raise RuntimeError(f"{path} is shorter than its header says")


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
