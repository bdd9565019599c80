"""The staged build: scan -> plan -> scatter -> pack -> commit. index.json is written last (the
commit point); until then the previous dataset in OUT stays intact and readable, whatever fails
and whenever.

A rebuild whose inputs are unchanged (see `unchanged`) stops after a few stat calls; the heavy
modules (anndata through the sources, scipy, joblib) are imported only once there is work to do.

The commit step (shards made durable, the index assembled and written, retired files removed) is
:mod:`pipeline.commit`; the refusals of input that would commit a wrong dataset are
:mod:`pipeline.refusals`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loaders import format as fmt
from loaders.plugins import PluginError
from pipeline import generations, parking, pipelined
from pipeline.backends import get_backend
from pipeline.buffers import release_thread_buffers
from pipeline.commit import commit
from pipeline.dryrun import drop_columns, nothing_to_do, plan_difference
from pipeline.events import EventLog
from pipeline.incremental import code_digest, known_sources, read_record, unchanged
from pipeline.manifest import Manifest, load_manifest
from pipeline.memory import release_freed_memory, trim_heap
from pipeline.model import Kind, PackResult, PlanContext, ShardPlan, get_kind
from pipeline.paths import shard_inside
from pipeline.planned import conditions_file, pack_config, park_tables, write_conditions
from pipeline.refusals import check_kept, check_same_dataset
from pipeline.resume import adopt_finished
from pipeline.shardfile import shard_suffix

if TYPE_CHECKING:
    from pipeline.dryrun import PlanDifference

log = logging.getLogger(__name__)
BACKENDS = ("threading", "loky", "dask", "ray")


@dataclass
class BuildResult:
    out: Path
    index: dict[str, Any]
    written: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    removed: int = (
        0  # files the commit deleted (shards and condition tables the new index no longer names)
    )
    changed: bool = (
        True  # False: OUT is exactly as it was (nothing written, nothing removed, same index)
    )
    difference: PlanDifference | None = (
        None  # --dry-run: what the build would do (and it did nothing)
    )


def previous_index(out: Path) -> fmt.Index | None:
    try:
        return fmt.read_index(out)
    except (fmt.FormatError, PluginError) as e:  # e.g. it names a plug-in this manifest dropped
        if fmt.index_path(out).exists():
            log.warning("ignoring the previous index (%s): everything is rebuilt", e)
        return None


def build(
    manifest_path: str | Path,
    out: str | Path | None = None,
    jobs: int | None = None,
    backend: str = "threading",
    scheduler: str | None = None,
    progress: bool = True,
    encoding: str | None = None,
    dry_run: bool = False,
    events: EventLog | None = None,
    wait: float = 0.0,
    replace: bool = False,
    rehash: bool = False,
) -> BuildResult:
    """Build or incrementally rebuild OUT from a manifest, through the manifest's kind
    (pipeline.kinds).

    `backend` defaults to threads: the heavy work (HDF5 reads, row gathers, compression, hashing,
    file I/O) runs in C without the GIL, while each loky process would first import the whole
    stack (~2-3 s) and hold its own copy of its tasks' plan. `dry_run`: scan and plan, report the
    difference (`BuildResult.difference`), write and delete nothing. `events`: a JSON-lines log
    (pipeline.events).

    One writer per OUT (`pipeline.generations.writing`): another build holding it ->
    `LockHeldError` at once, or after `wait` seconds; an OUT holding files that are not ours ->
    `OutputError`, nothing touched. An OUT holding another dataset (another name or kind) ->
    `OutputError` unless `replace` (`check_same_dataset`). A build that keeps no record ->
    `NothingKeptError`, nothing committed. `rehash`: read every source again for its digest (no
    stat cache, no up-to-date shortcut: `pipeline.fingerprint`)."""
    t0 = time.perf_counter()
    ev = events if events is not None else EventLog()
    manifest = load_manifest(manifest_path)
    if (
        encoding is not None and encoding != manifest.format
    ):  # e.g. `--format tar` for a zarr manifest
        manifest = dataclasses.replace(manifest, format=encoding)
    kind = get_kind(manifest.kind)
    out = Path(out) if out is not None else Path("shards") / manifest.name
    jobs = jobs or os.cpu_count() or 1

    executor = get_backend(backend, jobs, scheduler)  # bad names and options fail before any work
    ev.emit(
        "start",
        manifest=str(manifest.path),
        out=str(out),
        backend=backend,
        jobs=jobs,
        dry_run=dry_run,
        replace=replace,
    )
    args = (t0, ev, manifest, kind, out, jobs, backend, executor, progress, dry_run, replace)
    if (
        dry_run
    ):  # writes nothing, so takes no lock; a folder that is not ours is refused all the same
        generations.check_owned(out)
        return _build_locked(*args, rehash=rehash)
    with generations.writing(out, wait):
        return _build_locked(*args, rehash=rehash)


def _build_locked(
    t0: float,
    ev: EventLog,
    manifest: Manifest,
    kind: Kind,
    out: Path,
    jobs: int,
    backend: str,
    executor: Any,
    progress: bool,
    dry_run: bool,
    replace: bool = False,
    rehash: bool = False,
) -> BuildResult:
    park_budget = parking.budget(executor.shares_memory)  # a bad $SHARDSMITH_PARK_MB: before work
    pipeline_plan = pipelined.wanted()  # a bad $SHARDSMITH_PIPELINE_PLAN likewise
    prev = previous_index(out)
    check_same_dataset(out, prev, manifest, replace)
    saved = read_record(out) if prev is not None else {}
    if prev is not None and not rehash and unchanged(manifest, kind, out, prev, saved):
        shards = [s.file for s in prev.shards]
        if not dry_run:
            generations.sweep(out, prev)  # leftovers of killed builds, an interrupted cleanup
        log.info("%s is up to date: %d shards, nothing to rebuild", out, len(shards))
        ev.emit("up_to_date", shards=len(shards))

        return BuildResult(
            out,
            prev.raw,
            [],
            shards,
            {"scan": time.perf_counter() - t0, "total": time.perf_counter() - t0},
            changed=False,
            difference=nothing_to_do(prev) if dry_run else None,
        )
    if prev is not None and prev.name != manifest.name:
        log.warning(
            "%s holds dataset %r: this build of %r replaces it (its files go after two commits)",
            out,
            prev.name,
            manifest.name,
        )
    if not dry_run:
        generations.sweep(out, prev, dead_builds=False)  # their shards may be ours again, by name

    # the stat cache (pipeline.fingerprint): digests of sources whose stat the last build recorded
    cache = {} if rehash else dict(saved.get("stats") or {})
    # with more than one job, new sources are hashed on a second thread while metadata is read and
    # planned
    hasher = ThreadPoolExecutor(1, thread_name_prefix="hash") if jobs > 1 else None
    spill = out.resolve() / f".spill-{os.getpid()}"  # absolute: remote workers get its paths
    started, journal = False, None
    results: list[PackResult] = []
    try:
        scanned = kind.scan(manifest, cache, hasher)
        t_scan = time.perf_counter()
        ev.emit("scanned", sources=len(scanned), seconds=round(t_scan - t0, 3))
        # a name read back from index.json is reused only if it stays inside OUT: a tampered entry
        # naming ../../x must not become a shard of the new index (pipeline.paths.shard_inside)
        reusable = {
            s.plan_key: s
            for s in (prev.shards if prev is not None else [])
            if shard_inside(out, s.file) and (out / fmt.SHARDS_DIR / s.file).exists()
        }
        if dry_run:  # nothing is written: reused and new shards alike drop their planned columns
            park: Callable[[ShardPlan], None] = drop_columns
        else:
            (out / fmt.SHARDS_DIR).mkdir(parents=True, exist_ok=True)
            spill.mkdir(exist_ok=True)
            park = partial(park_tables, spill, set(reusable), kind.parked)
        known = known_sources(out, prev, saved) if prev is not None else None
        ctx = PlanContext(park, known, code_digest(), prev)
        # a first build may plan each source while the earlier ones are packed (pipeline.pipelined):
        # then `plan` holds no shards yet, and gains them as the pack takes its tasks
        stream = (
            pipelined.plan_stream(kind, manifest, scanned, ctx, executor, jobs)
            if pipeline_plan and not dry_run
            else None
        )
        plan = stream.plan if stream is not None else kind.plan(manifest, scanned, ctx)
        t_plan = time.perf_counter()
        if stream is None:  # after planning: its many temporaries are cheaper from the heap
            release_freed_memory()  # (a pipelined plan calls it once planned: pipeline.pipelined)
        cfg = pack_config(
            manifest, kind, plan, out, spill, executor.remote, jobs, stream is not None
        )
        todo = [i for i, sh in enumerate(plan.shards) if sh.key not in reusable]
        moved = {
            sh.key
            for sh in plan.shards
            if sh.key in reusable and reusable[sh.key].split != sh.split
        }
        # equal rows planned for another split (the split rules changed): a new shard, not a reuse
        if moved:
            reusable = {k: v for k, v in reusable.items() if k not in moved}
            park = park if dry_run else partial(park_tables, spill, set(reusable), kind.parked)
        if moved or (
            known and any(not plan.shards[i].columns and not plan.shards[i].n for i in todo)
        ):
            # a reused source's shard vanished meanwhile, or a shard moved: plan everything again
            plan = kind.plan(manifest, scanned, PlanContext(park, None, code_digest(), prev))
            todo = [i for i, sh in enumerate(plan.shards) if sh.key not in reusable]
        entries = {i: reusable[sh.key] for i, sh in enumerate(plan.shards) if sh.key in reusable}
        cond_file = conditions_file(plan, cfg) if plan.conditions else None
        new_files = [f"{fmt.SHARDS_DIR}/{sh.file}{shard_suffix(cfg)}" for sh in plan.shards] + (
            [cond_file] if cond_file else []
        )
        if dry_run:
            retired = generations.next_generation(out, prev, new_files)["retired"]
            diff = plan_difference(
                out, prev, plan.shards, shard_suffix(cfg), reusable, scanned, retired
            )
            ev.emit(
                "planned",
                shards=len(plan.shards),
                write=len(diff.write),
                reuse=len(diff.reuse),
                delete=len(diff.delete),
                seconds=round(t_plan - t_scan, 3),
            )
            return BuildResult(
                out,
                prev.raw if prev is not None else {},
                [],
                sorted(diff.reuse),
                {"scan": t_scan - t0, "plan": t_plan - t_scan, "total": time.perf_counter() - t0},
                changed=diff.changed,
                difference=diff,
            )
        if stream is None:
            ev.emit(
                "planned",
                shards=len(plan.shards),
                write=len(todo),
                reuse=len(plan.shards) - len(todo),
                seconds=round(t_plan - t_scan, 3),
            )
        executor.start()
        started = True
        journal = generations.write_journal(
            out, [new_files[i] for i in todo] + ([cond_file] if cond_file else [])
        )
        conditions = write_conditions(out, plan, cfg, cond_file) if cond_file else None
        plan.conditions = (
            None  # written: its vectors (conditions x dimensions, 27 MB at 2M cells) can go,
        )
        # and their pages with them, before the pack tasks' buffers come (pipeline.memory)
        trim_heap()

        missing, adopted = adopt_finished(kind, plan.shards, todo, cfg)
        if adopted:
            ev.emit("resumed", shards=len(adopted))
            results.extend(adopted)
        parking.open_park(spill, park_budget)
        on_result = partial(_shard_events, ev, plan.shards)
        if stream is not None:
            journaled = [cond_file] if cond_file else []
            run = pipelined.pack_pipelined(
                stream,
                kind,
                manifest,
                scanned,
                cfg,
                executor,
                progress,
                ev,
                on_result,
                journaled,
                since=t_scan,
            )
            results.extend(run.results)
            t_plan = run.planned_at
            todo = list(range(len(plan.shards)))  # a first build: every shard is new
        read, pack = ([], []) if stream else kind.pack_tasks(manifest, plan, scanned, missing, cfg)
        for phase, tasks in (("read sources", read), ("pack shards", pack)):
            if tasks:
                done = executor.map(tasks, phase, progress, on_result, spill)
                ev.emit(
                    "tasks",
                    phase=phase,
                    count=len(tasks),
                    backend=backend,
                    max_descriptor_bytes=executor.max_descriptor_bytes,
                )
                results.extend(r for rs in done for r in rs)
            if phase == "read sources":
                t_scatter = time.perf_counter()
        check_kept(manifest, out, prev, entries, results)
    except BaseException as e:
        generations.failed(out, prev, journal, e)
        raise
    finally:
        parking.close_park(spill)
        shutil.rmtree(spill, ignore_errors=True)
        release_thread_buffers()  # inline tasks ran on this thread (pipeline.buffers)
        if hasher is not None:
            hasher.shutdown(wait=True, cancel_futures=True)
        if started:
            executor.close()
    committed = commit(
        out, manifest, kind, plan, scanned, prev, entries, results, todo, conditions, cfg, journal
    )
    shard_entries, written, removed = committed.index.shards, committed.written, committed.removed
    log.info(
        "committed %s: %d shards (%d written, %d reused, %d stale removed)",
        out,
        len(shard_entries),
        len(written),
        len(shard_entries) - len(written),
        removed,
    )
    ev.emit(
        "committed",
        shards=len(shard_entries),
        written=len(written),
        reused=len(shard_entries) - len(written),
        removed=removed,
    )
    return BuildResult(
        out,
        committed.index.to_json(),
        written,
        committed.reused,
        {
            "scan": t_scan - t0,
            "plan": t_plan - t_scan,
            "scatter": t_scatter - t_plan,
            "pack": committed.durable_at - t_scatter,
            "commit": committed.done_at - committed.durable_at,
            "total": committed.done_at - t0,
        },
        removed=removed,
        changed=committed.changed,
    )


def _shard_events(ev: EventLog, shards: list[ShardPlan], results: list[PackResult]) -> None:
    for r in results:
        ev.emit("shard", file=r.entry.file, records=r.entry.records, bytes=r.entry.bytes)
