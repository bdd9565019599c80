"""The staged build: scan -> plan -> scatter -> pack -> commit. index.json is written last (the commit point);
until then the previous dataset in OUT stays intact and readable, whatever fails and whenever.

A rebuild whose inputs are unchanged (see `unchanged`) stops after a few stat calls; the heavy modules
(anndata through the sources, scipy, joblib) are imported only once there is work to do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from loaders import format as fmt
from pipeline import __version__, generations
from pipeline.incremental import code_digest, known_sources, read_record, save_inputs, unchanged
from pipeline.kinds import Kind, KindPlan, PackResult, PlanContext, ShardPlan, get_kind
from pipeline.manifest import Manifest, load_manifest
from pipeline.shardfile import make_durable, shard_suffix
from pipeline.writers import Codec

if TYPE_CHECKING:
    from pipeline.pack import PackConfig
    from pipeline.scan import ScannedSource

log = logging.getLogger(__name__)
T = TypeVar("T")
BACKENDS = ("threading", "loky", "dask", "ray")


@dataclass
class BuildResult:
    out: Path
    index: dict[str, Any]
    written: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def previous_index(out: Path) -> fmt.Index | None:
    try:
        return fmt.read_index(out)
    except fmt.FormatError as e:
        if fmt.index_path(out).exists():
            log.warning("ignoring the previous index (%s): everything is rebuilt", e)
        return None


def _run(jobs: int, backend: str, tasks: list[Callable[[], T]], desc: str, progress: bool) -> list[T]:
    """Run tasks with joblib, in order, with a progress bar. Outputs do not depend on `jobs`."""
    from joblib import Parallel, delayed, parallel_config
    from tqdm.auto import tqdm

    if not tasks:
        return []
    if jobs == 1 or len(tasks) == 1:
        return [t() for t in tqdm(tasks, desc=desc, unit="task", disable=not progress)]
    with parallel_config(backend=backend, n_jobs=jobs):
        gen = Parallel(return_as="generator")(delayed(t)() for t in tasks)
        return list(tqdm(gen, total=len(tasks), desc=desc, unit="task", disable=not progress))


def park_tables(spill: Path, reused: set[str], names: tuple[str, ...], shard: ShardPlan) -> None:
    """Keep the plan's memory per-record: a new shard's big planned tables (``names``: the kind's
    ``parked``) wait in the spill folder as .npy files (its pack task loads them and lets them go); a reused
    shard's columns are not needed at all."""
    if shard.key in reused:
        shard.columns.clear()
        return
    for name in names:
        a = shard.columns.get(name)
        if isinstance(a, np.ndarray) and a.nbytes > 1 << 16:
            path = spill / f"plan-{shard.source}-{shard.split}-{shard.part}-{name.replace('/', '~')}.npy"
            np.save(path, a, allow_pickle=False)
            shard.columns[name] = path


def release_freed_memory() -> None:
    """Make glibc return big freed blocks to the OS at once (a fixed 1 MiB mmap threshold).

    By default glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB), after
    which chunk-sized numpy temporaries are carved from per-thread heaps that are rarely trimmed: peak RSS
    then grows with every task a thread runs (+150 MiB at 400k cells, --jobs 2). The price is a fresh
    mmap per big temporary, hence the pack's reused buffers (`pipeline.spill.Scratch`), and the plan runs
    before this is set. No-op off glibc.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
        libc.malloc_trim(0)  # and hand back what the plan's temporaries left in the heap
    except (OSError, AttributeError):
        pass


def _backend_context(backend: str, scheduler: str | None) -> Any:
    if backend == "dask":
        from distributed import Client  # optional extra: pip install shardsmith[dask]

        return Client(scheduler) if scheduler else Client(processes=True)
    if backend == "ray":
        import ray  # optional extra: pip install shardsmith[ray]
        from ray.util.joblib import register_ray

        register_ray()
        ray.init(address=scheduler, ignore_reinit_error=True)
    return None


def conditions_file(plan: KindPlan, cfg: PackConfig) -> str:
    """The condition table's file name, from its content (so a rebuild with equal vectors reuses it)."""
    from pipeline.shardfile import shard_suffix

    columns = plan.conditions or {}
    h = hashlib.sha256()
    for key in (fmt.CONDITION_VECTORS, fmt.CONDITION_CODES):  # same digest as of the bytes joined, no copies
        if key in columns:
            h.update(np.ascontiguousarray(columns[key]))
    return f"conditions-{h.hexdigest()[:16]}{shard_suffix(cfg)}"


def write_conditions(out: Path, plan: KindPlan, cfg: PackConfig, name: str) -> fmt.ConditionsRef:
    """The condition table beside index.json, as ``name`` (`conditions_file`)."""
    from pipeline.shardfile import write_columns

    columns = plan.conditions or {}
    final = out / name
    digest, stored = write_columns(columns, final, cfg)
    vectors = columns[fmt.CONDITION_VECTORS]
    return fmt.ConditionsRef(file=final.name, rows=int(vectors.shape[0]), dim=int(vectors.shape[1]), sha256=digest,
                             bytes=stored, segments=list(plan.condition_segments))


def _source_doc(s: ScannedSource) -> dict[str, Any]:
    doc: dict[str, Any] = {**s.fingerprint.to_json(), "ordinal": s.ordinal, "type": s.spec.type}
    rows = getattr(s.meta, "n_rows", None)
    doc["rows"] = int(rows) if rows is not None else len(s.meta)
    if getattr(s.meta, "n_rows", None) is not None:
        doc["matrix"] = s.spec.matrix
    return doc


def build(manifest_path: str | Path, out: str | Path | None = None, jobs: int | None = None,
          backend: str = "threading", scheduler: str | None = None, progress: bool = True,
          encoding: str | None = None, wait: float = 0.0) -> BuildResult:
    """Build or incrementally rebuild OUT from a manifest, through the manifest's kind (pipeline.kinds).

    `backend` defaults to threads: the heavy work (HDF5 reads, row gathers, compression, hashing, file I/O)
    runs in C without the GIL, while each loky process would first import the whole stack (~2-3 s) and
    hold its own copy of its tasks' plan.

    One writer per OUT (`pipeline.generations.writing`): another build holding it -> `LockHeldError` at once,
    or after `wait` seconds; an OUT holding files that are not ours -> `OutputError`, nothing touched."""
    t0 = time.perf_counter()
    manifest = load_manifest(manifest_path)
    if encoding is not None and encoding != manifest.format:  # e.g. `--format tar` for a zarr manifest
        manifest = dataclasses.replace(manifest, format=encoding)
    kind = get_kind(manifest.kind)
    out = Path(out) if out is not None else Path("shards") / manifest.name
    jobs = jobs or os.cpu_count() or 1
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (expected one of {BACKENDS})")
    with generations.writing(out, wait):
        return _build_locked(t0, manifest, kind, out, jobs, backend, scheduler, progress)


def _build_locked(t0: float, manifest: Manifest, kind: Kind, out: Path, jobs: int, backend: str,
                  scheduler: str | None, progress: bool) -> BuildResult:
    prev = previous_index(out)
    saved = read_record(out) if prev is not None else {}
    if prev is not None and unchanged(manifest, kind, out, prev, saved):
        shards = [s.file for s in prev.shards]
        generations.sweep(out, prev)  # leftovers of killed builds, an interrupted cleanup
        log.info("%s is up to date: %d shards, nothing to rebuild", out, len(shards))
        return BuildResult(out, prev.raw, [], shards, {"scan": time.perf_counter() - t0, "total": time.perf_counter() - t0})
    if prev is not None and prev.name != manifest.name:
        log.warning("%s holds dataset %r: this build of %r replaces it (its files go after two commits)", out,
                    prev.name, manifest.name)
    generations.sweep(out, prev, dead_builds=False)  # their shards may be ours again, by name
    from pipeline.pack import PackConfig, budget

    cache = {str(s["path"]): s for s in (prev.sources if prev is not None else [])}
    # with more than one job, new sources are hashed on a second thread while metadata is read and planned
    hasher = ThreadPoolExecutor(1, thread_name_prefix="hash") if jobs > 1 else None
    spill = out / f".spill-{os.getpid()}"
    ctx = journal = None
    results: list[PackResult] = []
    try:
        scanned = kind.scan(manifest, cache, hasher)
        t_scan = time.perf_counter()
        (out / fmt.SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        reusable = {s.plan_key: s for s in (prev.shards if prev is not None else [])
                    if (out / fmt.SHARDS_DIR / s.file).exists()}
        spill.mkdir(exist_ok=True)
        park = partial(park_tables, spill, set(reusable), kind.parked)
        known = known_sources(out, prev, saved) if prev is not None else None
        plan = kind.plan(manifest, scanned, PlanContext(park, known, code_digest(), prev))
        t_plan = time.perf_counter()
        release_freed_memory()  # after planning: its many short-lived temporaries are cheaper from the heap
        cfg = PackConfig(out=out, spill=spill, encoding=manifest.format, codec=Codec(manifest.codec, manifest.codec_level),
                         **{"counts": False, "obsm": (), **kind.pack_options(manifest)}, fields=plan.fields,
                         block_rows=manifest.block_rows, tables=tuple(plan.tables), samples=tuple(kind.samples),
                         **budget())
        todo = [i for i, sh in enumerate(plan.shards) if sh.key not in reusable]
        if known and any(not plan.shards[i].columns and not plan.shards[i].n for i in todo):
            # a reused source's shard vanished meanwhile: plan everything again
            plan = kind.plan(manifest, scanned, PlanContext(park, None, code_digest(), prev))
            todo = [i for i, sh in enumerate(plan.shards) if sh.key not in reusable]
        entries = {i: reusable[sh.key] for i, sh in enumerate(plan.shards) if sh.key in reusable}
        ctx = _backend_context(backend, scheduler)
        cond_file = conditions_file(plan, cfg) if plan.conditions else None
        suffix = shard_suffix(cfg)
        journal = generations.write_journal(out, [f"{fmt.SHARDS_DIR}/{plan.shards[i].file}{suffix}" for i in todo]
                                            + ([cond_file] if cond_file else []))
        conditions = write_conditions(out, plan, cfg, cond_file) if cond_file else None
        read, pack = kind.pack_tasks(manifest, plan, scanned, todo, cfg)
        for r in _run(jobs, backend, read, "read sources", progress):
            results.extend(r)
        t_scatter = time.perf_counter()
        for r in _run(jobs, backend, pack, "pack shards", progress):
            results.extend(r)
    except BaseException:
        generations.abandon(out, prev, journal)
        raise
    finally:
        shutil.rmtree(spill, ignore_errors=True)
        if hasher is not None:
            hasher.shutdown(wait=True, cancel_futures=True)
        if ctx is not None:
            ctx.close()
    entries.update({r.number: r.entry for r in results})
    shard_entries = [entries[i] for i in range(len(plan.shards))]
    side = [conditions.file] if conditions is not None else []
    make_durable(out, [out / fmt.SHARDS_DIR / shard_entries[i].file for i in todo] + [out / f for f in side])
    t_pack = time.perf_counter()
    stats, section = record_outcomes(plan, prev, shard_entries, results, kind.name)
    index = fmt.Index(
        root=out, name=manifest.name, kind=manifest.kind, encoding=manifest.format, fields=list(plan.fields),
        tables=list(plan.tables), shards=shard_entries, samples=list(kind.samples), vocabularies=plan.vocabularies,
        obs_fields=plan.obs_fields, control_labels=plan.control_labels, conditions=conditions,
        codec=cfg.codec.to_json() if manifest.format == "zarr" else {"name": "none", "level": 0},
        sources=[_source_doc(s) for s in scanned], stats=stats,
        provenance={"manifest": str(manifest.path), "manifest_sha256": manifest.sha256, "seed": manifest.seed,
                    "shardsmith": __version__, "format_version": fmt.INDEX_VERSION},
        sections={kind.name: section},
        primary_records=plan.primary_records if plan.primary_records is not None
        else int(sum(e.records for e in shard_entries)))
    index = dataclasses.replace(index, **generations.next_generation(out, prev, index.files()))
    try:
        fmt.write_index(index)  # the commit
    except BaseException:
        generations.abandon(out, prev, journal)
        raise
    try:
        save_inputs(out, manifest, kind, scanned, plan)
    except OSError as e:  # a cache: the next build then plans everything
        log.warning("%s: could not record the build's inputs (%s): the next build re-plans", out, e)
    removed = generations.after_commit(out, index.retired)
    t_end = time.perf_counter()
    written = [shard_entries[i].file for i in todo]
    log.info("committed %s: %d shards (%d written, %d reused, %d stale removed)", out, len(shard_entries),
             len(written), len(shard_entries) - len(written), removed)
    return BuildResult(out, index.to_json(), written,
                       [e.file for i, e in enumerate(shard_entries) if i not in set(todo)],
                       {"scan": t_scan - t0, "plan": t_plan - t_scan, "scatter": t_scatter - t_plan,
                        "pack": t_pack - t_scatter, "commit": t_end - t_pack, "total": t_end - t0})


def record_outcomes(plan: KindPlan, prev: fmt.Index | None, entries: list[fmt.ShardEntry],
                    results: list[PackResult], kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The index's stats and kind section, with what pack tasks reported per shard: records skipped (by
    reason: nothing is lost silently) and per-record metadata. Reused shards keep what the previous
    index said of them."""
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


def _counts(entries: list[fmt.ShardEntry], fresh: dict[str, PackResult], prev: fmt.Index | None) -> dict[str, Any]:
    """Totals of what pack tasks changed to keep values exact (e.g. ``duplicate_entries_summed``), with the
    per-shard counts (``counts_by_shard``) that let a reused shard keep its share in later builds."""
    old = (prev.stats.get("counts_by_shard") if prev is not None else None) or {}
    by_shard = {e.file: dict(fresh[e.file].counts if e.file in fresh else old.get(e.file, {})) for e in entries}
    by_shard = {f: c for f, c in by_shard.items() if c}
    totals: dict[str, Any] = {}
    for c in by_shard.values():
        for name, n in c.items():
            totals[name] = totals.get(name, 0) + int(n)
    for name, n in totals.items():
        log.warning("%s: %d in %d shard(s) (see index.json stats.counts_by_shard)", name.replace("_", " "), n,
                    sum(name in c for c in by_shard.values()))
    return {**totals, "counts_by_shard": by_shard} if by_shard else {}
