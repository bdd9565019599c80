"""`shardsmith build --dry-run`: what a build would do to OUT, computed from the scan and the plan
alone.

Why: before a nightly job rewrites a large dataset, an operator (or the job itself) wants to know
how much it will write, keep and delete. The dry run scans the sources (metadata, and content
hashes of new files: the plan keys need them) and plans; it writes nothing, not even the spill
folder or the output folder, and deletes nothing. Shards to write are sized from the scan's
per-row entry counts (raw bytes; stored bytes estimated with the previous index's compression
ratio when there is one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders import format as fmt

if TYPE_CHECKING:
    from pipeline.model import ScannedSource, ShardPlan


@dataclass
class PlanDifference:
    """Shards (file names) the build would write, reuse and delete, with their bytes."""

    write: dict[str, int] = field(
        default_factory=dict
    )  # file -> estimated stored bytes (-1: unknown)
    reuse: dict[str, int] = field(default_factory=dict)  # file -> stored bytes (from the index)
    delete: dict[str, int] = field(default_factory=dict)  # file -> stored bytes on disk
    write_raw_bytes: int = 0  # uncompressed bytes of the shards to write (the scan's estimate)

    @property
    def changed(self) -> bool:
        return bool(self.write or self.delete)

    def to_json(self) -> dict[str, Any]:
        return {
            "write": len(self.write),
            "reuse": len(self.reuse),
            "delete": len(self.delete),
            "write_bytes": _total(self.write),
            "write_raw_bytes": self.write_raw_bytes,
            "reuse_bytes": _total(self.reuse),
            "delete_bytes": _total(self.delete),
            "files": {
                "write": sorted(self.write),
                "reuse": sorted(self.reuse),
                "delete": sorted(self.delete),
            },
        }

    def lines(self) -> list[str]:
        """What the CLI prints: one line per category, then one per file to write or delete."""
        unknown = any(
            v < 0 for v in self.write.values()
        )  # no earlier build to take a compression ratio from
        stored = "stored size unknown" if unknown else f"~{_mb(_total(self.write))} stored"
        out = [
            f"would write  {len(self.write):5d} shards  {stored} ({_mb(self.write_raw_bytes)} raw)",
            f"would reuse  {len(self.reuse):5d} shards   {_mb(_total(self.reuse))}",
            f"would delete {len(self.delete):5d} shards   {_mb(_total(self.delete))}",
        ]
        out += [f"  + {f}" for f in sorted(self.write)] + [f"  - {f}" for f in sorted(self.delete)]
        return out


def _total(d: Mapping[str, int]) -> int:
    return int(sum(v for v in d.values() if v > 0))


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def raw_estimate(shard: ShardPlan, scanned: Sequence[ScannedSource]) -> int:
    """Uncompressed bytes of a matrix shard from the scan's per-row entry counts (8 bytes per stored
    entry plus the row pointer); 0 for kinds whose scan has no such counts."""
    meta = scanned[shard.source].meta if 0 <= shard.source < len(scanned) else None
    row_nnz = getattr(meta, "row_nnz", None)
    if row_nnz is None or shard.rows.size == 0:
        return 0
    return int(8 * np.asarray(row_nnz)[shard.rows].sum() + 8 * (shard.rows.size + 1))


def plan_difference(
    out: Path,
    prev: fmt.Index | None,
    shards: Sequence[ShardPlan],
    suffix: str,
    reusable: Mapping[str, fmt.ShardEntry],
    scanned: Sequence[ScannedSource],
    retired: Sequence[str] = (),
) -> PlanDifference:
    """Compare the plan with OUT: reused shards keep their entry; every other planned shard is
    written; the shards the commit would retire (``retired``:
    `pipeline.generations.next_generation`; the previous generation's are kept) are deleted."""
    diff = PlanDifference()
    ratio = None
    if prev is not None and prev.shards:
        raw, stored = sum(e.raw_bytes for e in prev.shards), sum(e.bytes for e in prev.shards)
        ratio = stored / raw if raw else None
    for sh in shards:
        entry = reusable.get(sh.key)
        if entry is not None:
            diff.reuse[entry.file] = int(entry.bytes)
            continue
        raw = raw_estimate(sh, scanned)
        diff.write_raw_bytes += raw
        diff.write[sh.file + suffix] = int(raw * ratio) if ratio is not None and raw else -1
    prefix = f"{fmt.SHARDS_DIR}/"
    for rel in retired:
        if rel.startswith(prefix):
            diff.delete[rel[len(prefix) :]] = fmt.stored_bytes(out / rel)
    return diff


def drop_columns(shard: ShardPlan) -> None:
    """The dry run's `park`: a shard that will not be packed needs no planned columns (memory stays
    per-cell)."""
    shard.columns.clear()


def nothing_to_do(prev: fmt.Index) -> PlanDifference:
    """The difference of a no-change rebuild: every shard reused."""
    return PlanDifference(reuse={e.file: int(e.bytes) for e in prev.shards})
