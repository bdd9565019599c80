"""Plan and pack in one pipeline: a source's shards are packed while the next source is planned.

Why: the plan was serial and on the critical path (~2.3 s of a 13 s build at 2M cells, one core
busy, the other idle but for hashing). A source's shards depend only on the dataset-wide tables
(cell table, splits, conditions) and on that source, so once those tables exist, sources can be
planned one at a time and handed to the pack as they come.

How: a planner thread plans the sources in order and queues each one's tasks; the backend takes
them from that queue as its workers free up. The plan counts as one of the build's jobs: it holds
one of ``jobs`` permits while it runs, and each task holds one while it packs, so the build never
runs more than ``jobs`` threads of work, and its memory holds at most the plan's tables and one
source's planning temporaries beside ``jobs - 1`` pack tasks (where the serial build held the plan,
then ``jobs`` tasks). Planned sources waiting for a worker hold little: their big planned columns
are parked in spill files, as in the serial build. Shards, the index and results are those of the
serial build, byte for byte: the same per-source plans, in the same order
(``tests/pipeline/test_pipelined.py``).

When: ``$SHARDSMITH_PIPELINE_PLAN=1``, and a first build of OUT (no index to reuse shards from:
reuse decisions need every key), with more than one job on the threading backend (loky's workers
are processes the permits cannot gate; a cluster backend takes its tasks as one list), at least two
sources a job (each source is then one task: no barrier between a read and a pack phase), and a
kind that plans per source (:meth:`pipeline.model.Kind.plan_stream`). Otherwise the build plans
first.

Measured, and why it is off by default: on 2 cores at 2M cells (8 sources, ``--jobs 2``) it first
gave 1.05x wall but a peak RSS of 318 MiB instead of 245 (the scale rule allows ~258). With the
condition vectors dropped once written, a leaner per-source plan and glibc's heaps bounded while the
plan runs beside the pack (``bound_heaps``) its peak is 240 MiB, and it is then 1.00-1.02x the wall
of the plan-first build: nothing to gain on few cores, so the plan-first build stays the default
(docs/PIPELINE.md, "Planning pipelined with packing, opt-in").
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from loaders import format as fmt
from pipeline import generations
from pipeline.backends import Backend, OnResult
from pipeline.errors import ShardsmithError
from pipeline.events import EventLog
from pipeline.manifest import Manifest
from pipeline.memory import bound_heaps, release_freed_memory
from pipeline.model import (
    Kind,
    PackConfig,
    PackResult,
    PlanContext,
    PlanStream,
    ScannedSource,
    Task,
)
from pipeline.resume import adopt_finished
from pipeline.shardfile import shard_suffix

ENV = "SHARDSMITH_PIPELINE_PLAN"


def wanted() -> bool:
    """$SHARDSMITH_PIPELINE_PLAN: "1" pipelines a first build's plan (module doc, "When"); unset or
    "0" plans first (the default: module doc, "Measured"). Read when the build starts, so a bad
    value fails before any work."""
    raw = os.environ.get(ENV, "").strip()
    if raw in ("", "0", "1"):
        return raw == "1"
    raise ShardsmithError(
        f"${ENV}={raw!r}: expected 1 (plan each source while the earlier ones are packed) or 0"
    )


def plan_stream(
    kind: Kind,
    manifest: Manifest,
    scanned: Sequence[ScannedSource],
    ctx: PlanContext,
    executor: Backend,
    jobs: int,
) -> PlanStream | None:
    """The kind's per-source plan when this build can pipeline it (module doc, "When"; the build
    asks only when `wanted`), else None (plan whole)."""
    if (
        ctx.previous is not None
        or ctx.known
        or jobs < 2
        or not executor.shares_memory
        or len(scanned) < 2 * jobs
    ):
        return None
    return kind.plan_stream(manifest, scanned, ctx)


@dataclass
class Pipelined:
    """What a pipelined build leaves for the commit, and when its plan ended (perf_counter)."""

    results: list[PackResult] = field(default_factory=list)
    planned_at: float = 0.0


def pack_pipelined(
    stream: PlanStream,
    kind: Kind,
    manifest: Manifest,
    scanned: Sequence[ScannedSource],
    cfg: PackConfig,
    executor: Backend,
    progress: bool,
    ev: EventLog,
    on_result: OnResult,
    journaled: list[str],
    since: float,
) -> Pipelined:
    """Pack every source's shards while the later sources are planned (module doc). The build
    has started the executor and journaled (``generations.write_journal``) the files in
    ``journaled``; each source's shard files join the journal before its tasks are made. ``since``:
    when planning began (the "planned" event's seconds, as in the plan-first build)."""
    plan, files = stream.plan, list(journaled)
    done = Pipelined()
    # the plan is one of the build's jobs: while it runs, one task fewer packs, so the build never
    # has more than `jobs` threads of work, nor more than one plan and jobs - 1 tasks in memory
    permits = threading.Semaphore(executor.jobs)
    ready: queue.SimpleQueue[Any] = queue.SimpleQueue()
    stop = threading.Event()

    def plan_sources() -> None:  # the planner thread
        try:
            with permits:
                for new in stream.sources:  # plans one source
                    if stop.is_set():
                        return
                    shards = [plan.shards[i] for i in new]
                    files.extend(f"{fmt.SHARDS_DIR}/{sh.file}{shard_suffix(cfg)}" for sh in shards)
                    generations.write_journal(cfg.out, files)  # before any of them is written
                    missing, finished = adopt_finished(kind, plan.shards, list(new), cfg)
                    done.results.extend(finished)
                    read, pack = kind.pack_tasks(manifest, plan, scanned, missing, cfg)
                    if pack:  # the pipeline has no phase 2: whole_sources forbids one
                        raise RuntimeError(f"kind {kind.name!r} split a source (whole_sources)")
                    for task in read:
                        ready.put(partial(_gated, permits, stop, task))
                done.planned_at = time.perf_counter()
                release_freed_memory()  # the plan's temporaries (pipeline.memory)
            ev.emit(
                "planned",
                shards=len(plan.shards),
                write=len(plan.shards),
                reuse=0,
                seconds=round(done.planned_at - since, 3),
                pipelined=True,
            )
        except BaseException as e:  # raised in the build's thread, by the task iterator
            ready.put(e)
        finally:
            ready.put(_END)

    def tasks() -> Iterator[Task]:
        while (item := ready.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item

    bound_heaps()  # the plan beside pack tasks, under one glibc (pipeline.memory)
    planner = threading.Thread(target=plan_sources, name="plan", daemon=True)
    planner.start()
    try:
        ran = executor.map(tasks(), "read sources", progress, on_result, cfg.spill, len(scanned))
    finally:
        stop.set()
        planner.join()
    ev.emit("tasks", phase="read sources", count=len(ran), backend=executor.name, pipelined=True)
    if done.results:
        ev.emit("resumed", shards=len(done.results))
    done.results += [r for rs in ran for r in rs]
    return done


_END = object()


def _gated(permits: threading.Semaphore, stop: threading.Event, task: Task) -> Any:
    """Run ``task`` holding one of the build's job permits (see pack_pipelined). A failed task
    sets ``stop``: the planner ends after the source it is planning (the backend waits for the
    tasks it started, one of which may be waiting for the planner's permit), and tasks not yet
    run do nothing, since the build fails with the first error."""
    with permits:
        if stop.is_set():
            return []
        try:
            return task()
        except BaseException:
            stop.set()
            raise
