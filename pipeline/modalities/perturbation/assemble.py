"""The last step of a pack task: a shard's rows, once read and routed, become its file.

The read side (:mod:`pipeline.modalities.perturbation.pack`) delivers each shard's rows as sorted
pieces, in memory or in the spill files of its scatter tasks; here those pieces are found again
(`pack_shard`, by the spill-file names `spill_file` gives both sides), streamed in planned order
beside the plan's columns, validated, written (`write_shard`) and reported with what was changed to
keep values exact (``duplicate_entries_summed``). Why a module of its own: this is the write side of
the pack, and it needs none of the source reading, row routing or task sizing that decide how the
pieces are made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loaders import format as fmt
from pipeline import parking
from pipeline.modalities.perturbation.spill import (
    ENTRY_ARRAYS,
    NARROW,
    OBSM,
    RANGE,
    ROW_ARRAYS,
    OpenFiles,
    Piece,
    ShardRows,
    file_pieces,
    memory_piece,
    parked_bytes,
)
from pipeline.model import PackConfig, PackResult, ShardPlan
from pipeline.planned import load_column
from pipeline.shardfile import finish_shard

SUMMED = "summed"  # int64 per delivered piece: duplicate entries summed away in its rows
DUPLICATES_SUMMED = "duplicate_entries_summed"  # the index stat (pipeline.commit.record_outcomes)


def obsm_widths(cfg: PackConfig) -> dict[str, tuple[int, ...]]:
    return {
        k: next(f.shape for f in cfg.fields if f.name == fmt.OBSM_PREFIX + k)
        for k in cfg.options.obsm
    }


@dataclass(frozen=True)
class Target:
    """A shard to build from one source: its number in the plan, its source rows in shard order, and
    the stored matrix entries of those rows from the scan's per-row counts (exact for CSR
    sources, an upper bound for dense ones, whose zeros the CSR conversion drops): the size
    estimate that picks a path."""

    number: int
    rows: np.ndarray
    nnz: int


def spill_file(spill: Path, number: int, task: int, name: str) -> Path:
    """Where scatter task ``task`` appends array ``name`` of shard ``number``."""
    return spill / f"{number:06d}-{task:05d}.{name}.bin"


def drop_consumed(cfg: PackConfig, paths: Sequence[Path]) -> None:
    """Delete consumed spill files now (`PackConfig.drop_spill`), not when the build ends."""
    if cfg.drop_spill:
        for path in paths:
            path.unlink(missing_ok=True)


def memory_pieces(
    segs: Sequence[dict[str, np.ndarray]],
) -> tuple[list[Piece], list[np.ndarray], int]:
    """(pieces, index ranges, duplicates summed) of a shard's segments kept in memory: a fused
    source's (`pack.pack_source`) or a parked read task's (`pipeline.parking`)."""
    pieces = [memory_piece(seg) for seg in segs]
    summed = sum(int(seg[SUMMED].sum()) for seg in segs if SUMMED in seg)
    return pieces, [seg[RANGE] for seg in segs], summed


def pack_shard(t: Target, shard: ShardPlan, tasks: int, cfg: PackConfig) -> PackResult:
    """Pack a shard from the pieces its source's scatter tasks left (in task order): parked in
    memory (`pipeline.parking`) or in spill files."""
    names = [
        *ENTRY_ARRAYS,
        NARROW,
        *ROW_ARRAYS,
        RANGE,
        SUMMED,
        *(f"{OBSM}{k}" for k in cfg.options.obsm),
    ]
    pieces: list[Piece] = []
    ranges = [np.zeros(0, np.int64)]
    summed = 0
    opened = OpenFiles()
    held = 0  # bytes of parked pieces (pipeline.parking), given back once the shard is written
    try:
        for task in range(tasks):
            segs = parking.take(cfg.spill, (t.number, task))
            if segs is not None:  # this task's rows were kept in memory
                held += parked_bytes(segs)
                more, more_ranges, more_summed = memory_pieces(segs)
                pieces, ranges, summed = pieces + more, ranges + more_ranges, summed + more_summed
                continue
            files = {name: spill_file(cfg.spill, t.number, task, name) for name in names}
            if files["pos"].exists():
                pieces += file_pieces(files, obsm_widths(cfg), opened)
                ranges.append(np.fromfile(files[RANGE], np.int64))
            if files[SUMMED].exists():  # written only by segments whose rows repeated a column
                summed += int(np.fromfile(files[SUMMED], np.int64).sum())
        result = write_shard(t.number, shard, pieces, cfg, np.concatenate(ranges), summed)
    finally:
        opened.close()
        del pieces
        parking.release(cfg.spill, held)
    drop_consumed(
        cfg,
        [spill_file(cfg.spill, t.number, task, name) for task in range(tasks) for name in names],
    )
    return result


def write_shard(
    number: int,
    shard: ShardPlan,
    pieces: list[Piece],
    cfg: PackConfig,
    index_ranges: np.ndarray,
    summed: int = 0,
) -> PackResult:
    """Validate and write one shard: the plan's columns plus its matrix and obsm rows, streamed from
    pieces. `summed`: duplicate entries its rows had in the source, summed away (reported in the
    index stats)."""
    try:
        import numcodecs.blosc  # import weight: ~0.2 s, pack tasks only

        numcodecs.blosc.set_nthreads(1)  # one core per task: --jobs decides the parallelism
    except ImportError:  # pragma: no cover
        pass
    matrix = ShardRows(
        pieces,
        shard.n,
        cfg.fields[0].shape[0],
        obsm_widths(cfg),
        f"shard {number} ({shard.file})",
        index_ranges,
    )
    planned = {
        k: load_column(v, k, matrix.scratch) if isinstance(v, Path) else v
        for k, v in shard.columns.items()
    }
    entry = finish_shard({**planned, **matrix.columns()}, shard, cfg)
    drop_consumed(cfg, [v for v in shard.columns.values() if isinstance(v, Path)])
    return PackResult(number, entry, counts={DUPLICATES_SUMMED: summed} if summed else {})
