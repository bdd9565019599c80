"""Writing one shard file, for every kind: validate against the schema, write atomically (temp name,
hash, rename), count the units of each sample type the dataset serves, make the index entry. And
making new files durable before the index that names them is committed."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loaders import format as fmt
from loaders.format.digests import feed_mapped
from loaders.format.validate import validate_columns
from pipeline.writers import get_writer

if TYPE_CHECKING:
    from pipeline.model import PackConfig, ShardPlan


def write_columns(
    columns: Mapping[str, Any], final: Path, cfg: PackConfig, tables: Sequence[str] = ()
) -> tuple[str, int]:
    """Write atomically (temp name, hash, rename); returns (content digest, stored bytes). The
    build makes the new files durable (make_durable) before it commits the index that names them."""
    if (
        final.exists()
    ):  # same name = same plan key = same bytes (a crash after rename, before commit)
        return fmt.content_hash(final), fmt.stored_bytes(final)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    try:
        get_writer(cfg.encoding, cfg.codec).write(
            tmp,
            columns,
            tables,  # type: ignore[arg-type]
            fmt.column_codecs(cfg.fields),
        )
        # mapped, not read: the writer's own fresh files (loaders.format.digests.feed_mapped)
        digest, stored = fmt.content_hash(tmp, feed=feed_mapped), fmt.stored_bytes(tmp)
        os.replace(tmp, final)
    except BaseException:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink()
        raise
    return digest, stored


def shard_suffix(cfg: PackConfig) -> str:
    return get_writer(cfg.encoding, cfg.codec).suffix  # type: ignore[arg-type]


def finish_shard(columns: Mapping[str, Any], shard: ShardPlan, cfg: PackConfig) -> fmt.ShardEntry:
    """Validate ``columns`` against the schema, write them as ``shard``'s file and return its index
    entry (records, and units per sample type counted by the sample types themselves)."""
    n = validate_columns(columns, cfg.fields, cfg.tables, name=shard.file)
    final = cfg.out / fmt.SHARDS_DIR / (shard.file + shard_suffix(cfg))
    digest, stored = write_columns(columns, final, cfg, cfg.tables)
    return shard_entry(columns, n, final, digest, stored, shard, cfg)


def shard_entry(
    columns: Mapping[str, Any],
    n: int,
    final: Path,
    digest: str,
    stored: int,
    shard: ShardPlan,
    cfg: PackConfig,
) -> fmt.ShardEntry:
    """The index entry of a written shard (also of one read back: pipeline.resume)."""
    from loaders.samples import (
        get_sample_type,
    )  # here: build imports this module before its no-change check

    units = {s: get_sample_type(s).count(columns) for s in cfg.samples}
    return fmt.ShardEntry(
        file=final.name,
        split=shard.split,
        records=n,
        units=units,
        bytes=stored,
        raw_bytes=int(sum(a.nbytes for a in columns.values())),
        digest=digest,
        plan_key=shard.key,
        source=shard.source,
        part=shard.part,
    )


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

    One syncfs(2) of the output's file system costs about as much as a single fsync; fsyncing
    each of the ~30 files of every zarr shard cost 0.1-0.3 s per shard here. Falls back to
    per-file fsync off Linux.
    """
    try:
        import ctypes  # only where the platform has the call

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
