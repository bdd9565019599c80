"""The commit: the new shards made durable, then the index written last and atomically (the commit
point), then the build's inputs recorded and the files the new generation retires removed.

The index is assembled here from the plan and what the pack tasks reported: records skipped by
reason (`record_outcomes`: nothing is lost silently), per-record metadata, the counts of values
changed to stay exact (``counts_by_shard``), the sources, provenance and generation; a reused shard
keeps what the previous index said of it. Why a module of its own: the stages before it
(:mod:`pipeline.build`) decide what to write; this one only turns their results into the committed
dataset, and a failure anywhere in it still leaves the previous dataset committed
(:func:`pipeline.generations.failed`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaders import format as fmt
from pipeline import __version__, generations
from pipeline.incremental import save_inputs
from pipeline.manifest import Manifest
from pipeline.model import Kind, KindPlan, PackConfig, PackResult, ScannedSource
from pipeline.shardfile import make_durable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Committed:
    """What the commit did, for the build's report."""

    index: fmt.Index  # as written (its shards: every shard of the plan, in plan order)
    written: list[str]  # shard files this build wrote
    reused: list[str]  # shard files taken from the previous index
    removed: int  # files deleted after the commit (shards and condition tables no longer named)
    changed: bool  # False: OUT is exactly as it was (nothing written, nothing removed, same index)
    durable_at: float  # time.perf_counter() once the new files were made durable
    done_at: float  # time.perf_counter() at the end of the commit


def commit(
    out: Path,
    manifest: Manifest,
    kind: Kind,
    plan: KindPlan,
    scanned: Sequence[ScannedSource],
    prev: fmt.Index | None,
    entries: dict[int, fmt.ShardEntry],
    results: list[PackResult],
    todo: Sequence[int],
    conditions: fmt.ConditionsRef | None,
    cfg: PackConfig,
    journal: Path | None,
) -> Committed:
    """Commit the build: ``entries`` are the reused shards by plan number (the pack ``results`` add
    the new ones, numbers ``todo``), ``conditions`` the condition table written beside the index,
    ``journal`` the build's journal (:func:`pipeline.generations.write_journal`)."""
    entries.update({r.number: r.entry for r in results})
    shard_entries = [entries[i] for i in range(len(plan.shards))]
    side = [conditions.file] if conditions is not None else []
    make_durable(
        out, [out / fmt.SHARDS_DIR / shard_entries[i].file for i in todo] + [out / f for f in side]
    )
    t_pack = time.perf_counter()
    stats, section = record_outcomes(plan, prev, shard_entries, results, kind.name)
    index = fmt.Index(
        root=out,
        name=manifest.name,
        kind=manifest.kind,
        encoding=manifest.format,
        fields=list(plan.fields),
        tables=list(plan.tables),
        shards=shard_entries,
        samples=list(kind.samples),
        vocabularies=plan.vocabularies,
        obs_fields=plan.obs_fields,
        control_labels=plan.control_labels,
        conditions=conditions,
        codec=cfg.codec.to_json() if manifest.format == "zarr" else {"name": "none", "level": 0},
        sources=[_source_doc(s) for s in scanned],
        stats=stats,
        provenance={
            "manifest": str(manifest.path),
            "manifest_sha256": manifest.sha256,
            "seed": manifest.seed,
            "shardsmith": __version__,
            "format_version": fmt.INDEX_VERSION,
        },
        sections={kind.name: section},
        plugins=list(manifest.plugins),
        primary_records=plan.primary_records
        if plan.primary_records is not None
        else int(sum(e.records for e in shard_entries)),
    )
    index = _stats_as_before(index, prev)
    before = fmt.index_path(out).read_bytes() if prev is not None else b""
    if not todo and _says_the_same(index, prev, before):
        index = prev  # type: ignore[assignment]  # nothing to commit: the dataset is as it was
    else:
        index = dataclasses.replace(index, **generations.next_generation(out, prev, index.files()))
        try:
            fmt.write_index(index)  # the commit
        except BaseException as e:
            generations.failed(out, prev, journal, e)
            raise
    try:
        save_inputs(out, manifest, kind, scanned, plan)
    except OSError as e:  # a cache: the next build then plans everything
        log.warning("%s: could not record the build's inputs (%s): the next build re-plans", out, e)
    removed = generations.after_commit(out, index.retired)
    t_end = time.perf_counter()
    written = [shard_entries[i].file for i in todo]
    return Committed(
        index,
        written,
        [e.file for i, e in enumerate(shard_entries) if i not in set(todo)],
        removed,
        bool(written or removed) or fmt.index_path(out).read_bytes() != before,
        t_pack,
        t_end,
    )


def _stats_as_before(index: fmt.Index, prev: fmt.Index | None) -> fmt.Index:
    """The sources whose content is the committed index's (same path, same digest) keep the size
    and mtime that index gave them: a source rewritten with the same bytes (``shardsmith demo``
    run again, a copy with ``cp`` not ``cp -p``) is no change of the dataset."""
    if prev is None:
        return index
    old = {(str(d.get("path")), d.get("digest")): d for d in prev.sources}
    sources = []
    for d in index.sources:
        was = old.get((str(d.get("path")), d.get("digest")))
        sources.append(
            d if was is None else {**d, "size": was["size"], "mtime_ns": was["mtime_ns"]}
        )
    return dataclasses.replace(index, sources=sources)


def _says_the_same(index: fmt.Index, prev: fmt.Index | None, before: bytes) -> bool:
    """Whether ``index`` (no shard written) says exactly what the committed index.json says, but
    for its generation: then no new generation is committed, and the build reports no change."""
    if prev is None or not before:
        return False
    same_generation = dataclasses.replace(
        index, generation=prev.generation, previous=prev.previous, retired=list(prev.retired)
    )
    try:
        return bool(same_generation.to_json() == json.loads(before))
    except ValueError:
        return False


def _source_doc(s: ScannedSource) -> dict[str, Any]:
    doc: dict[str, Any] = {**s.fingerprint.to_json(), "ordinal": s.ordinal, "type": s.spec.type}
    rows = getattr(s.meta, "n_rows", None)
    doc["rows"] = int(rows) if rows is not None else len(s.meta)
    if getattr(s.meta, "n_rows", None) is not None:
        doc["matrix"] = s.spec.matrix
    return doc


def record_outcomes(
    plan: KindPlan,
    prev: fmt.Index | None,
    entries: list[fmt.ShardEntry],
    results: list[PackResult],
    kind: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The index's stats and kind section, with what pack tasks reported per shard: records skipped
    (by reason: nothing is lost silently) and per-record metadata. Reused shards keep what the
    previous index said of them."""
    fresh = {entries[r.number].file: r for r in results}
    old_skips = (prev.stats.get("skipped_by_shard") if prev is not None else None) or {}
    old_records = ((prev.section(kind) if prev is not None else {}).get("records")) or {}
    skipped_by_shard: dict[str, dict[str, int]] = {}
    records: dict[str, Any] = {}
    for e in entries:
        r = fresh.get(e.file)
        skips = r.skipped if r is not None else old_skips.get(e.file, {})
        if skips:
            skipped_by_shard[e.file] = dict(skips)
        meta = r.records if r is not None else old_records.get(e.file)
        if meta is not None:
            records[e.file] = meta
    stats, section = dict(plan.stats), dict(plan.section)
    if skipped_by_shard:
        totals: dict[str, int] = {}
        for skips in skipped_by_shard.values():
            for reason, n in skips.items():
                totals[reason] = totals.get(reason, 0) + int(n)
        stats["skipped"], stats["skipped_by_shard"] = totals, skipped_by_shard
    if records:
        section["records"] = records
    stats.update(_counts(entries, fresh, prev))
    return stats, section


def _counts(
    entries: list[fmt.ShardEntry], fresh: dict[str, PackResult], prev: fmt.Index | None
) -> dict[str, Any]:
    """Totals of what pack tasks changed to keep values exact (e.g. ``duplicate_entries_summed``),
    with the per-shard counts (``counts_by_shard``) that let a reused shard keep its share in
    later builds."""
    old = (prev.stats.get("counts_by_shard") if prev is not None else None) or {}
    by_shard = {
        e.file: dict(fresh[e.file].counts if e.file in fresh else old.get(e.file, {}))
        for e in entries
    }
    by_shard = {f: c for f, c in by_shard.items() if c}
    totals: dict[str, Any] = {}
    for c in by_shard.values():
        for name, n in c.items():
            totals[name] = totals.get(name, 0) + int(n)
    for name, n in totals.items():
        log.warning(
            "%s: %d in %d shard(s) (see index.json stats.counts_by_shard)",
            name.replace("_", " "),
            n,
            sum(name in c for c in by_shard.values()),
        )
    return {**totals, "counts_by_shard": by_shard} if by_shard else {}
