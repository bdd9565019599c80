"""Stage 3: pack. Two bounded-memory passes so every source is read once, sequentially:

1. scatter (one task per source): read the source in row blocks, route each block's planned rows to small
   per-shard spill pieces (.npy files of plain arrays, never pickled);
2. pack (one task per shard): gather the shard's pieces into planned row order, encode, compress, write to a
   temporary name, hash, rename (one syncfs before the commit makes all new shards durable).

Peak memory follows the block size and the shard size, never the source or dataset size.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from loaders import format as fmt
from pipeline.errors import SourceError
from pipeline.manifest import SourceSpec
from pipeline.plan import ShardPlan
from pipeline.sources import open_source
from pipeline.writers import Codec, get_writer


@dataclass(frozen=True)
class PackConfig:
    out: Path
    spill: Path
    encoding: str
    codec: Codec
    counts: bool  # values are raw counts: negative entries are an error
    obsm: tuple[str, ...]
    fields: tuple[fmt.FieldSpec, ...]
    block_rows: int


def _save_piece(spill: Path, shard: int, block_start: int, arrays: dict[str, np.ndarray]) -> None:
    """Plain .npy files (np.savez would CRC every byte through zipfile: 4x slower for nothing)."""
    for name, a in arrays.items():
        np.save(spill / f"{shard:06d}-{block_start:012d}.{name.replace('/', '~')}.npy", a, allow_pickle=False)


def _load_pieces(spill: Path, shard: int, names: list[str]) -> list[dict[str, np.ndarray]]:
    starts = sorted({p.name.split(".")[0] for p in spill.glob(f"{shard:06d}-*.pos.npy")})
    return [{n: np.load(spill / f"{s}.{n.replace('/', '~')}.npy", allow_pickle=False) for n in names} for s in starts]


def scatter_source(spec: SourceSpec, n_rows: int, targets: Sequence[tuple[int, np.ndarray]], cfg: PackConfig) -> int:
    """Route the planned rows of one source to spill pieces; `targets` = (shard number, source rows)."""
    if not targets:
        return 0
    rows = np.concatenate([r for _, r in targets])
    shard_of = np.concatenate([np.full(r.size, i, np.int64) for i, r in targets])
    pos = np.concatenate([np.arange(r.size, dtype=np.int64) for _, r in targets])
    order = np.argsort(rows, kind="stable")
    rows, shard_of, pos = rows[order], shard_of[order], pos[order]
    routed = 0
    with open_source(spec.type, spec.path, spec.matrix, counts=cfg.counts) as src:
        first = int(rows[0]) // cfg.block_rows * cfg.block_rows
        for b in range(first, int(rows[-1]) + 1, cfg.block_rows):
            e = min(b + cfg.block_rows, n_rows)
            lo, hi = np.searchsorted(rows, [b, e])
            if lo == hi:
                continue
            block = src.read_rows(b, e)  # validated by the source: structure, NaN/inf, negative counts
            embeds = {k: src.read_obsm(k, b, e) for k in cfg.obsm}
            for k, a in embeds.items():
                if not np.isfinite(a).all():
                    bad = b + int(np.flatnonzero(~np.isfinite(a).all(axis=tuple(range(1, a.ndim))))[0])
                    raise SourceError(spec.path, f"obsm[{k!r}] has NaN/inf at row {bad}")
            local, sh, ps = rows[lo:hi] - b, shard_of[lo:hi], pos[lo:hi]
            for target in np.unique(sh):
                m = sh == target
                sub = block[local[m]]
                extra = {f"obsm/{k}": a[local[m]] for k, a in embeds.items()}
                _save_piece(cfg.spill, int(target), b, {"indptr": sub.indptr.astype(np.int64),
                            "indices": sub.indices.astype(np.int32, copy=False),
                            "data": sub.data.astype(np.float32, copy=False), "pos": ps[m], **extra})
            routed += hi - lo
    return int(routed)


def _gather_pieces(number: int, n: int, cfg: PackConfig) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {"indptr": [], "indices": [], "data": [], "pos": []}
    embeds: dict[str, list[np.ndarray]] = {k: [] for k in cfg.obsm}
    pieces = _load_pieces(cfg.spill, number, [*parts, *(f"obsm/{k}" for k in cfg.obsm)])
    for z in pieces:
        for k in parts:
            parts[k].append(z[k] if k != "indptr" else np.diff(z[k]))
        for k in cfg.obsm:
            embeds[k].append(z[f"obsm/{k}"])
    pos = np.concatenate(parts["pos"]) if pieces else np.zeros(0, np.int64)
    if pos.size != n or (n and not np.array_equal(np.sort(pos), np.arange(n))):
        raise RuntimeError(f"shard {number}: spill holds {pos.size} rows, plan has {n}")
    lengths = np.concatenate(parts["indptr"]) if pieces else np.zeros(0, np.int64)
    n_cols = cfg.fields[0].shape[0]
    mat = sp.csr_matrix((np.concatenate(parts["data"]) if pieces else np.zeros(0, np.float32),
                         np.concatenate(parts["indices"]) if pieces else np.zeros(0, np.int32),
                         np.r_[0, np.cumsum(lengths)]), shape=(n, n_cols))
    inverse = np.empty(n, np.int64)
    inverse[pos] = np.arange(n)
    mat = mat[inverse]
    out = {f"{fmt.X}/indptr": mat.indptr.astype(np.int64), f"{fmt.X}/indices": mat.indices.astype(np.int32),
           f"{fmt.X}/data": mat.data.astype(np.float32)}
    for k, chunks in embeds.items():
        out[f"{fmt.OBSM_PREFIX}{k}"] = np.concatenate(chunks)[inverse].astype(np.float32)
    return out


def fsync_tree(path: Path) -> None:
    for p in [path] if path.is_file() else sorted(path.rglob("*")):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def make_durable(folder: Path, written: list[Path]) -> None:
    """Flush new shards to disk before the index may point at them.

    One syncfs(2) of the output's file system costs about as much as a single fsync; fsyncing each of the
    ~30 files of every zarr shard cost 0.1-0.3 s per shard here. Falls back to per-file fsync off Linux.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(folder, os.O_RDONLY)
        try:
            if libc.syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    for p in written:
        fsync_tree(p)


def write_columns(columns: dict[str, np.ndarray], final: Path, cfg: PackConfig) -> tuple[str, int]:
    """Write atomically (temp name, hash, rename); returns (sha256, stored bytes). The build makes the new
    files durable (make_durable) before it commits the index that names them."""
    if final.exists():  # same name = same plan key = same bytes (a crash after rename, before commit)
        return fmt.content_hash(final), fmt.stored_bytes(final)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    try:
        get_writer(cfg.encoding, cfg.codec).write(tmp, columns)
        digest = fmt.content_hash(tmp)
        os.replace(tmp, final)
    except BaseException:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink()
        raise
    return digest, fmt.stored_bytes(final)


def pack_shard(number: int, shard: ShardPlan, cfg: PackConfig) -> fmt.ShardEntry:
    try:
        import numcodecs.blosc

        numcodecs.blosc.set_nthreads(1)  # one core per task: --jobs decides the parallelism
    except ImportError:  # pragma: no cover
        pass
    columns = {**shard.columns, **_gather_pieces(number, shard.n, cfg)}
    n = fmt.validate_columns(columns, cfg.fields, name=shard.file)
    suffix = get_writer(cfg.encoding, cfg.codec).suffix
    final = cfg.out / fmt.SHARDS_DIR / (shard.file + suffix)
    digest, stored = write_columns(columns, final, cfg)
    return fmt.ShardEntry(
        file=final.name, split=shard.split, records=n, primary=int(columns[fmt.PRIMARY].sum()),
        pairs=int(columns[fmt.PAIRS].shape[0]), sentences=int(columns[fmt.SENTENCES_PERT].shape[0]),
        bytes=stored, raw_bytes=int(sum(a.nbytes for a in columns.values())), sha256=digest,
        plan_key=shard.key, source=shard.source,
    )
