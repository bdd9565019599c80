"""Resuming a build that failed: shards it finished are adopted, not rebuilt.

Why: a build on a cluster can die late (a lost node, a killed job, a full disk) after writing
most of its shards. Each shard is written under a temporary name and renamed
(``pipeline.shardfile``), and its name carries its plan key, so a file under its final name is a
complete shard of exactly that plan. The next build of the same manifest reads such a shard back
(its columns give the index entry: records, units, bytes, hash) instead of reading its source
rows again, so only the missing shards cost source reads and compression. A file that cannot be
read back is removed and rebuilt.

Only kinds whose pack results are the index entry alone can be adopted (``Kind.resumable``):
record kinds also report skipped records and per-record metadata that only their pack task knows.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence

from loaders import format as fmt
from loaders.format.readers import read_shard
from loaders.format.validate import validate_columns
from pipeline.model import Kind, PackConfig, PackResult, ShardPlan
from pipeline.shardfile import shard_entry, shard_suffix

log = logging.getLogger(__name__)


def adopt_finished(
    kind: Kind, shards: Sequence[ShardPlan], todo: Sequence[int], cfg: PackConfig
) -> tuple[list[int], list[PackResult]]:
    """(shards still to pack, results of those adopted from an earlier, failed build)."""
    if not getattr(kind, "resumable", False):
        return list(todo), []
    keys = fmt.shard_keys(cfg.fields, cfg.tables)
    remaining, adopted = [], []
    for i in todo:
        final = cfg.out / fmt.SHARDS_DIR / (shards[i].file + shard_suffix(cfg))
        if not final.exists():
            remaining.append(i)
            continue
        try:
            columns = read_shard(final, cfg.encoding, keys)
            n = validate_columns(columns, cfg.fields, cfg.tables, name=final.name)
            if n != shards[i].n:
                raise fmt.FormatError(f"{final}: {n} records, the plan has {shards[i].n}")
            entry = shard_entry(
                columns, n, final, fmt.content_hash(final), fmt.stored_bytes(final), shards[i], cfg
            )
        except Exception as e:  # unreadable or not this plan's shard: rebuild it
            log.warning("%s: left by an earlier build but unreadable (%s): rebuilding it", final, e)
            shutil.rmtree(final, ignore_errors=True) if final.is_dir() else final.unlink(
                missing_ok=True
            )
            remaining.append(i)
            continue
        adopted.append(PackResult(i, entry))
    return remaining, adopted
