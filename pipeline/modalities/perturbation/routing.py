"""Stage 3's read: a source's rows [start, stop) read block by block, and each block's planned
rows routed to their shards as pieces sorted by planned position (`pipeline.modalities.
perturbation.spill`'s `Piece`). Where the pieces then wait (memory, the park or spill files) is
`pipeline.modalities.perturbation.pack`'s choice; this module only reads, checks and routes.

Why a module of its own: it is the one place that touches a source's bytes during the pack, and
what it costs per block (the read, the duplicate sum, one row gather per piece) is the build's
hot loop (docs/PIPELINE.md, "Memory").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from pipeline.buffers import GATHERED, Scratch, thread_scratch
from pipeline.errors import SourceError
from pipeline.manifest import SourceSpec
from pipeline.memory import trim_heap
from pipeline.modalities.perturbation.assemble import SUMMED, Target
from pipeline.modalities.perturbation.matrix import open_source
from pipeline.modalities.perturbation.spill import OBSM, RANGE, ROW_ARRAYS, gather_rows
from pipeline.modalities.perturbation.validate import sum_duplicates, validate_block
from pipeline.model import PackConfig

# (source row, shard number, position in the shard) of each planned row, sorted by source row
Routed = tuple[np.ndarray, np.ndarray, np.ndarray]


def route(targets: Sequence[Target]) -> Routed:
    """(source row, shard number, position in the shard) of every planned row, sorted by source row;
    int32 where the values fit (the read tasks of a big source hold these until they run: 12
    bytes a row, not 24)."""
    rows = np.concatenate([t.rows for t in targets])
    small = np.int32 if max((t.rows.size for t in targets), default=0) < 2**31 else np.int64
    shard_of = np.concatenate(
        [np.full(t.rows.size, t.number, np.int32) for t in targets]
    )  # plan's shard numbers
    pos = np.concatenate([np.arange(t.rows.size, dtype=small) for t in targets])
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    if rows.size and rows[-1] < 2**31:
        rows = rows.astype(np.int32)
    return rows, shard_of[order], pos[order]


def rows_between(rows: np.ndarray, a: int, b: int) -> tuple[int, int]:
    """Where source rows [a, b) lie in the sorted `rows`. The bounds go in `rows`' own dtype
    where it holds them: as a list they are int64, and searchsorted would cast all of `rows` (a
    source's, int32) to int64 for every block."""
    dt = rows.dtype if b <= np.iinfo(rows.dtype).max else np.dtype(np.int64)
    lo, hi = np.searchsorted(rows, np.array([a, b], dt))
    return int(lo), int(hi)


def read_routed(
    spec: SourceSpec,
    n_rows: int,
    routed: Routed,
    start: int,
    stop: int,
    cfg: PackConfig,
    scratch: Scratch | None = None,
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Read source rows [start, stop) block by block; yield (shard, rows of that shard from the
    block), each sorted by planned position. With `scratch` the entry arrays are reused buffers,
    valid until the next segment (for a consumer that writes them out at once)."""
    rows, shard_of, pos = routed
    with open_source(spec.type, spec.path, spec.matrix, counts=cfg.options.counts) as src:
        src.buffers = thread_scratch()  # each block is done with before the next is read
        for b in range(start, min(stop, n_rows), cfg.block_rows):
            e = min(b + cfg.block_rows, n_rows, stop)
            lo, hi = rows_between(rows, b, e)
            if lo == hi:
                continue
            block = src.read_rows(
                b, e
            )  # validated by the source: structure, NaN/inf, negative counts
            block, summed = sum_duplicates(
                block
            )  # one canonical CSR for every reader (counted per shard)
            if summed is not None:
                validate_block(
                    block, spec.path, b, cfg.options.counts
                )  # a sum can overflow float32
            embeds = {k: src.read_obsm(k, b, e) for k in cfg.options.obsm}
            for k, a in embeds.items():
                if not np.isfinite(a).all():
                    bad = b + int(
                        np.flatnonzero(~np.isfinite(a).all(axis=tuple(range(1, a.ndim))))[0]
                    )
                    raise SourceError(spec.path, f"obsm[{k!r}] has NaN/inf at row {bad}")
            sorted_rows = bool(block.has_canonical_format)  # scipy caches it: no second pass
            ptr = block.indptr.astype(np.int32 if block.nnz < 2**31 else np.int64, copy=False)
            indices = block.indices.astype(ptr.dtype, copy=False)
            data = block.data.astype(np.float32, copy=False)
            row_len = np.diff(ptr).astype(np.int64)
            by_shard = np.lexsort((pos[lo:hi], shard_of[lo:hi]))
            local, sh = rows[lo:hi][by_shard] - b, shard_of[lo:hi][by_shard]
            ps = pos[lo:hi][by_shard].astype(ROW_ARRAYS["pos"], copy=False)  # spilled as raw int64
            cuts = np.r_[0, np.flatnonzero(np.diff(sh)) + 1, sh.size]
            for u, v in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
                sel = local[u:v]
                lengths = row_len[sel]
                n = int(lengths.sum())
                out_i = (
                    scratch.get(GATHERED + "indices", indices.dtype, n)
                    if scratch
                    else np.empty(n, indices.dtype)
                )
                out_d = (
                    scratch.get(GATHERED + "data", data.dtype, n)
                    if scratch
                    else np.empty(n, data.dtype)
                )
                gather_rows(ptr, indices, data, sel, out_i, out_d)  # one row gather per piece
                seg = {
                    "data": out_d,
                    "indices": out_i.astype(np.int32, copy=False),
                    "lengths": lengths,
                    "pos": ps[u:v],
                    RANGE: index_range(out_i, lengths, sorted_rows),
                    **{f"{OBSM}{k}": a[sel] for k, a in embeds.items()},
                }
                if summed is not None:
                    seg[SUMMED] = np.array([summed[sel].sum()], np.int64)
                yield int(sh[u]), seg
            del block, indices, data, ptr
            # per block: a whole-source task reads ~16 blocks before its end (pipeline.memory)
            trim_heap()


def index_range(indices: np.ndarray, lengths: np.ndarray, sorted_rows: bool) -> np.ndarray:
    """(min, max) of a piece's column indices, for the format's range check. Rows whose columns
    are sorted (a canonical block: nearly always) give them from each row's first and last entry,
    O(rows) instead of two passes over every entry (0.27 s of py-spy samples in a 2M-cell
    build)."""
    if not indices.size:
        return np.array([], np.int64)
    if not sorted_rows:
        return np.array([indices.min(), indices.max()], np.int64)
    ends = np.cumsum(lengths)
    full = lengths > 0
    return np.array(
        [indices[(ends - lengths)[full]].min(), indices[ends[full] - 1].max()], np.int64
    )
