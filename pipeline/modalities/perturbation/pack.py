"""Stage 3: pack. Every source is read once, sequentially, in row blocks; each block's planned rows
are routed to their shards; a shard whose rows have all arrived is put into planned row order,
encoded, compressed, written to a temporary name and renamed (one syncfs before the commit makes
all new shards durable).

A shard is a uniform random sample of its source, so its rows are complete only when the whole
source has been read. Until then they wait, as sorted pieces
(`pipeline.modalities.perturbation.spill`):

* in memory (`pack_source`), when the source's planned rows fit `MatrixPackOptions.fuse_bytes`:
  one task reads the source and packs its shards, with no intermediate files;
* in spill files (`scatter_range` then `pack_shard`), for bigger sources: several tasks read row
  ranges of the source (so a single big file still keeps every job busy) and append each shard's
  rows to plain binary files; one task per shard packs it from its files. With two sources or
  more a job there is no need to split files: one task reads a source and then packs its shards
  (`_whole_source`).

Packing streams: each compressed chunk is gathered from the pieces on demand, so a pack task
holds a few chunks, never a whole shard. Peak memory follows `fuse_bytes` and the block size, not
the dataset size.

This module sizes the tasks and keeps the routed rows (memory, park or spill files); the read and
route of each block is `pipeline.modalities.perturbation.routing`, and a shard's pieces become its
file in `pipeline.modalities.perturbation.assemble` (`write_shard`, and `pack_shard` from spill
files).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import parking
from pipeline.buffers import thread_scratch
from pipeline.errors import SourceError
from pipeline.manifest import SourceSpec
from pipeline.memory import trim_heap
from pipeline.modalities.perturbation.assemble import (
    Target,
    drop_consumed,
    memory_pieces,
    obsm_widths,
    pack_shard,
    spill_file,
    write_shard,
)
from pipeline.modalities.perturbation.routing import Routed, read_routed, route, rows_between
from pipeline.modalities.perturbation.spill import NARROW, NARROW_LIMIT, RANGE, parked_bytes
from pipeline.model import PackConfig, PackResult, ScannedSource, ShardPlan
from pipeline.planned import release_columns

FUSE_BYTES = 96 << 20  # sources up to this many raw bytes are packed in memory, without spill files
SCATTER_BYTES = 64 << 20  # raw bytes of a source read by one scatter task


@dataclass(frozen=True)
class MatrixPackOptions:
    """The perturbation kind's pack settings (``PackConfig.options``)."""

    counts: bool  # values are raw counts: negative entries are an error
    obsm: tuple[str, ...]  # embeddings carried along
    fuse_bytes: int = (
        FUSE_BYTES  # read when the build starts (``pack_options``), so a test can lower them
    )
    scatter_bytes: int = SCATTER_BYTES


def pack_options(counts: bool, obsm: tuple[str, ...]) -> MatrixPackOptions:
    """This module's current memory settings with the manifest's matrix settings."""
    return MatrixPackOptions(counts, tuple(obsm), FUSE_BYTES, SCATTER_BYTES)


def raw_bytes(t: Target, cfg: PackConfig) -> int:
    return _bytes(t.nnz, t.rows.size, cfg)


def _bytes(nnz: int, n_rows: int, cfg: PackConfig) -> int:
    """What `n_rows` routed rows holding `nnz` entries take as pieces (`spill.parked_bytes`)."""
    width = sum(int(np.prod(s, dtype=np.int64)) for s in obsm_widths(cfg).values())
    return 8 * nnz + n_rows * (16 + 4 * width)


def pack_source(
    spec: SourceSpec, n_rows: int, shards: Sequence[tuple[Target, ShardPlan]], cfg: PackConfig
) -> list[PackResult]:
    """Read a source whose planned rows fit in memory and pack all its shards: no spill files."""
    segs = _in_memory(spec, n_rows, route([t for t, _ in shards]), 0, n_rows, cfg)
    out = []
    for t, plan in shards:
        pieces, ranges, summed = memory_pieces(segs.pop(t.number, []))
        out.append(write_shard(t.number, plan, pieces, cfg, np.concatenate(ranges), summed))
    return out


def _in_memory(
    spec: SourceSpec,
    n_rows: int,
    routed: Routed,
    start: int,
    stop: int,
    cfg: PackConfig,
) -> dict[int, list[dict[str, np.ndarray]]]:
    """Source rows [start, stop) routed to their shards and kept: shard -> its segments, in block
    order (a fused source's whole read, or a parked read task's range)."""
    segs: dict[int, list[dict[str, np.ndarray]]] = {}
    for number, seg in read_routed(spec, n_rows, routed, start, stop, cfg):
        segs.setdefault(number, []).append(seg)
    return segs


def scatter_range(
    spec: SourceSpec,
    n_rows: int,
    routed: Routed,
    start: int,
    stop: int,
    task: int,
    cfg: PackConfig,
) -> int:
    """Append the planned rows of source rows [start, stop) to per-shard spill files (raw arrays,
    never pickled; one file per shard, task and array, so tasks never share a file)."""
    handles: dict[tuple[int, str], Any] = {}
    routed_rows = 0
    narrow = cfg.fields[0].shape[0] <= NARROW_LIMIT  # every valid column index fits a uint16
    scratch = thread_scratch()
    try:
        for number, seg in read_routed(spec, n_rows, routed, start, stop, cfg, scratch):
            for name, a in seg.items():
                if name == "indices" and narrow:
                    name, a = NARROW, narrowed(a, seg[RANGE], scratch, spec)
                fh = handles.get((number, name))
                if fh is None:
                    fh = handles[(number, name)] = open(
                        spill_file(cfg.spill, number, task, name), "wb"
                    )  # noqa: SIM115
                np.ascontiguousarray(a).tofile(fh)
            routed_rows += seg["pos"].size
    finally:
        for fh in handles.values():
            fh.close()
    return routed_rows


def narrowed(indices: np.ndarray, irange: np.ndarray, scratch: Any, spec: SourceSpec) -> np.ndarray:
    """A piece's column indices as uint16 (`spill.NARROW`), in a reused buffer. The source's
    checks keep indices within its columns; a piece whose measured range does not fit stops the
    build rather than wrap."""
    if irange.size and (int(irange[0]) < 0 or int(irange[1]) >= NARROW_LIMIT):
        raise SourceError(
            spec.path, f"column indices {irange.tolist()} do not fit the matrix's columns"
        )
    out = scratch.get(NARROW, np.uint16, indices.size)
    np.copyto(out, indices, casting="unsafe")
    return out


def pack_tasks(
    shards: Sequence[ShardPlan],
    scanned: Sequence[ScannedSource],
    todo: Sequence[int],
    cfg: PackConfig,
) -> tuple[list[Callable[[], list[PackResult]]], list[Callable[[], list[PackResult]]]]:
    """Tasks of the two phases: (1) read every source once, (2) pack the shards of spilled sources.

    A source whose planned rows fit `cfg.options.fuse_bytes` is one phase-1 task that also packs
    its shards (no spill). A bigger one is read by several phase-1 tasks over row ranges of about
    `cfg.options.scatter_bytes` (aligned to blocks, so one big file still keeps every job busy)
    that spill, and each of its shards is a phase-2 task. Tasks are listed biggest first so that
    parallel jobs finish together.

    With at least two sources a job (`cfg.jobs`), or `cfg.whole_sources` (a pipelined build hands
    the sources over one at a time), each spilled source is instead one phase-1 task
    that reads it and then packs its shards (`_whole_source`): every job stays busy without
    splitting files, there is no barrier between the phases, and only the sources being worked on
    wait in spill files (all of them did, ~4 GB at 2M cells: past the kernel's dirty-page limits,
    so they were written back to disk).
    """
    by_source: dict[int, list[tuple[Target, ShardPlan]]] = {}
    for i in todo:
        sh = shards[i]
        nnz = int(scanned[sh.source].meta.row_nnz[sh.rows].sum())
        by_source.setdefault(sh.source, []).append((Target(i, sh.rows, nnz), sh))
    read: list[tuple[int, Callable[[], list[PackResult]]]] = []
    pack: list[tuple[int, Callable[[], list[PackResult]]]] = []
    for s, items in by_source.items():
        spec, n_rows = scanned[s].spec, scanned[s].meta.n_rows
        size = sum(raw_bytes(t, cfg) for t, _ in items)
        if size <= cfg.options.fuse_bytes:
            read.append((size, partial(_fused, spec, n_rows, items, cfg)))
            continue
        rows, shard_of, pos = route([t for t, _ in items])
        if cfg.whole_sources or len(by_source) >= 2 * cfg.jobs:
            part = _park_routed(cfg.spill, s, 0, (rows, shard_of, pos))
            read.append((size, partial(_whole_source, spec, n_rows, part, items, cfg)))
            continue
        k = max(1, -(-size // cfg.options.scatter_bytes))
        cuts = sorted(
            {
                0,
                n_rows,
                *(
                    int(rows[rows.size * j // k]) // cfg.block_rows * cfg.block_rows
                    for j in range(1, k)
                ),
            }
        )
        tasks, row_nnz = 0, scanned[s].meta.row_nnz
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            lo, hi = rows_between(rows, a, b)
            if lo < hi:
                part = _park_routed(cfg.spill, s, tasks, (rows[lo:hi], shard_of[lo:hi], pos[lo:hi]))
                need = _bytes(int(row_nnz[rows[lo:hi]].sum()), int(hi - lo), cfg)
                task = partial(_scatter, spec, n_rows, part, a, b, tasks, cfg, need)
                read.append((size // k, task))
                tasks += 1
        pack += [(raw_bytes(t, cfg), partial(_pack, t, sh, tasks, cfg)) for t, sh in items]
    return (
        [t for _, t in sorted(read, key=lambda x: -x[0])],
        [t for _, t in sorted(pack, key=lambda x: -x[0])],
    )


def _park_routed(
    spill: Path, source: int, task: int, routed: tuple[np.ndarray, ...]
) -> tuple[str, ...]:
    """A read task's routed rows (12 bytes a row of its range) wait in the spill folder, not in the
    task: every task is made before the first runs, and the task lists live until their phase
    ends, so in memory they would add 12 bytes per cell of the dataset to the build's peak."""
    paths = []
    for name, a in zip(("rows", "shard", "pos"), routed, strict=True):
        path = spill / f"routed-{source:05d}-{task:05d}-{name}.npy"
        np.save(path, a, allow_pickle=False)
        paths.append(str(path))
    return tuple(paths)


def _scatter(
    spec: SourceSpec,
    n_rows: int,
    part: tuple[str, ...],
    start: int,
    stop: int,
    task: int,
    cfg: PackConfig,
    need: int = 0,
) -> list[PackResult]:
    """Route source rows [start, stop) to their shards' pieces: kept in the build's memory park
    when its budget grants the `need` bytes they take (`pipeline.parking`), else spill files."""
    rows, shard_of, pos = (np.load(p, allow_pickle=False) for p in part)
    drop_consumed(cfg, [Path(p) for p in part])
    routed = (rows, shard_of, pos)
    if need and parking.reserve(cfg.spill, need):
        park_range(spec, n_rows, routed, start, stop, task, cfg, need)
    else:
        scatter_range(spec, n_rows, routed, start, stop, task, cfg)
    del rows, shard_of, pos, routed
    _end_task()
    return []


def park_range(
    spec: SourceSpec,
    n_rows: int,
    routed: Routed,
    start: int,
    stop: int,
    task: int,
    cfg: PackConfig,
    reserved: int,
) -> None:
    """`scatter_range` into memory: each shard's pieces of rows [start, stop) are parked under
    (shard, task) for its pack task (`assemble.pack_shard`); the budget follows what they hold."""
    held = 0
    for number, segs in _in_memory(spec, n_rows, routed, start, stop, cfg).items():
        held += parked_bytes(segs)
        parking.put(cfg.spill, (number, task), segs)
    parking.release(cfg.spill, reserved - held)  # the pieces' exact size, not the estimate


def _whole_source(
    spec: SourceSpec,
    n_rows: int,
    part: tuple[str, ...],
    shards: Sequence[tuple[Target, ShardPlan]],
    cfg: PackConfig,
) -> list[PackResult]:
    """One spilled source in one task: read it all (one scatter), then pack each of its shards.

    Always through spill files: one task writes and reads back its own, and keeping its rows in
    the memory park instead saved ~0.1 of ~2.1 CPU-s per 250k-cell source while it added the
    source's ~400 MB to the peak (docs/PIPELINE.md, "Memory")."""
    _scatter(spec, n_rows, part, 0, n_rows, 0, cfg)
    out = [pack_shard(t, sh, 1, cfg) for t, sh in shards]
    _end_task()
    return out


def _pack(t: Target, shard: ShardPlan, tasks: int, cfg: PackConfig) -> list[PackResult]:
    out = [pack_shard(t, shard, tasks, cfg)]
    _end_task()
    return out


def _end_task() -> None:
    """What every task of this module does when it is done: the planned columns' buffers go (a
    task's shards reuse them, the next source's read does not need them), then the heap's free
    pages go back to the OS (pipeline.memory)."""
    release_columns(thread_scratch())
    trim_heap()


def _fused(
    spec: SourceSpec, n_rows: int, shards: Sequence[tuple[Target, ShardPlan]], cfg: PackConfig
) -> list[PackResult]:
    out = pack_source(spec, n_rows, shards, cfg)
    _end_task()
    return out
