"""The staged build: scan -> plan -> scatter -> pack -> commit. index.json is written last (the commit point);
until then the previous dataset in OUT stays intact and readable, whatever fails and whenever.

A rebuild whose inputs are unchanged (see `unchanged`) stops after a few stat calls; the heavy modules
(anndata through the sources, scipy, joblib) are imported only once there is work to do.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from loaders import format as fmt
from pipeline import __version__
from pipeline.incremental import code_digest, known_sources, read_record, save_inputs, unchanged
from pipeline.manifest import Manifest, load_manifest
from pipeline.writers import Codec, get_writer

if TYPE_CHECKING:
    from pipeline.pack import PackConfig
    from pipeline.plan import Plan, ShardPlan
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


def dataset_fields(manifest: Manifest, scanned: list[ScannedSource]) -> tuple[fmt.FieldSpec, ...]:
    first = scanned[0].meta
    out = [fmt.FieldSpec(fmt.X, "csr", "float32", (first.n_cols,)),
           fmt.FieldSpec(fmt.SAMPLE_ID, "dense", "int64"),
           fmt.FieldSpec(fmt.PRIMARY, "dense", "bool"),
           fmt.FieldSpec(fmt.COND_ID, "dense", "int32")]
    out += [fmt.FieldSpec(fmt.OBS_PREFIX + f, "dense", "int32") for f in manifest.fields.obs_fields]
    out += [fmt.FieldSpec(fmt.OBSM_PREFIX + k, "dense", "float32", tuple(first.obsm[k][0][1:]))
            for k in manifest.fields.obsm]
    return tuple(out)


def previous_index(out: Path) -> dict[str, Any] | None:
    try:
        return fmt.read_index(out).raw
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


def park_tables(spill: Path, reused: set[str], shard: ShardPlan) -> None:
    """Keep the plan's memory per-cell: a new shard's slot tables wait in the spill folder as .npy files
    (its pack task loads them and lets them go); a reused shard's columns are not needed at all."""
    if shard.key in reused:
        shard.columns.clear()
        return
    for name in fmt.TABLES:
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


def write_conditions(out: Path, plan: Plan, cfg: PackConfig) -> dict[str, Any]:
    from pipeline.pack import write_columns

    cond = plan.conditions
    columns = {"vectors": cond.vectors, "codes": cond.codes}
    h = hashlib.sha256(np.ascontiguousarray(cond.vectors))  # same digest as of the bytes joined, no copies
    h.update(np.ascontiguousarray(cond.codes))
    final = out / f"conditions-{h.hexdigest()[:16]}{get_writer(cfg.encoding, cfg.codec).suffix}"
    digest, stored = write_columns(columns, final, cfg)
    return {"file": final.name, "sha256": digest, "bytes": stored, "n": int(cond.vectors.shape[0]),
            "dim": int(cond.vectors.shape[1]), "segments": cond.segments}


def collect_garbage(out: Path, keep: Iterable[str]) -> int:
    """After a commit: remove shards and condition tables the new index no longer references."""
    keep = set(keep)
    removed = 0
    candidates = list((out / fmt.SHARDS_DIR).iterdir()) + list(out.glob("conditions-*"))
    for p in candidates:
        if p.name in keep:
            continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        removed += 1
    return removed


def build(manifest_path: str | Path, out: str | Path | None = None, jobs: int | None = None,
          backend: str = "threading", scheduler: str | None = None, progress: bool = True) -> BuildResult:
    """Build or incrementally rebuild OUT from a manifest.

    `backend` defaults to threads: the heavy work (HDF5 reads, row gathers, compression, hashing, file I/O)
    runs in C without the GIL, while each loky process would first import the whole stack (~2-3 s) and
    hold its own copy of its tasks' plan."""
    t0 = time.perf_counter()
    manifest = load_manifest(manifest_path)
    out = Path(out) if out is not None else Path("shards") / manifest.name
    jobs = jobs or os.cpu_count() or 1
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (expected one of {BACKENDS})")
    prev = previous_index(out)
    saved = read_record(out) if prev is not None else {}
    if prev is not None and unchanged(manifest, out, prev, saved):
        shards = [s["file"] for s in prev.get("shards", [])]
        log.info("%s is up to date: %d shards, nothing to rebuild", out, len(shards))
        return BuildResult(out, prev, [], shards, {"scan": time.perf_counter() - t0, "total": time.perf_counter() - t0})
    from pipeline.pack import PackConfig, budget, make_durable, pack_tasks
    from pipeline.plan import make_plan
    from pipeline.scan import scan

    cache = {s["path"]: s for s in (prev or {}).get("sources", [])}
    # with more than one job, new sources are hashed on a second thread while metadata is read and planned
    hasher = ThreadPoolExecutor(1, thread_name_prefix="hash") if jobs > 1 else None
    spill = out / f".spill-{os.getpid()}"
    ctx = None
    try:
        scanned = scan(manifest, cache, hasher)
        t_scan = time.perf_counter()
        (out / fmt.SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        reusable = {s["plan_key"]: fmt.ShardEntry.from_json(s) for s in (prev or {}).get("shards", [])
                    if (out / fmt.SHARDS_DIR / s["file"]).exists()}
        spill.mkdir(exist_ok=True)
        plan = make_plan(manifest, scanned, park=partial(park_tables, spill, set(reusable)),
                         known=known_sources(out, prev, saved) if prev is not None else None, salt=code_digest())
        t_plan = time.perf_counter()
        release_freed_memory()  # after planning: its many short-lived temporaries are cheaper from the heap
        fields = dataset_fields(manifest, scanned)
        cfg = PackConfig(out=out, spill=spill, encoding=manifest.format,
                         codec=Codec(manifest.codec, manifest.codec_level), counts=manifest.fields.values == "counts",
                         obsm=manifest.fields.obsm, fields=fields, block_rows=manifest.block_rows, **budget())
        todo = [i for i, sh in enumerate(plan.shards) if sh.key not in reusable]
        if any(not plan.shards[i].columns for i in todo):  # a reused source's shard vanished meanwhile
            plan = make_plan(manifest, scanned, park=partial(park_tables, spill, set(reusable)), salt=code_digest())
            todo = [i for i, sh in enumerate(plan.shards) if sh.key not in reusable]
        entries = {i: reusable[sh.key] for i, sh in enumerate(plan.shards) if sh.key in reusable}
        ctx = _backend_context(backend, scheduler)
        conditions = write_conditions(out, plan, cfg)
        read, pack = pack_tasks(plan.shards, scanned, todo, cfg)
        for r in _run(jobs, backend, read, "read sources", progress):
            entries.update(r)
        t_scatter = time.perf_counter()
        entries.update(_run(jobs, backend, pack, "pack shards", progress))
    finally:
        shutil.rmtree(spill, ignore_errors=True)
        if hasher is not None:
            hasher.shutdown(wait=True, cancel_futures=True)
        if ctx is not None:
            ctx.close()
    shard_entries = [entries[i] for i in range(len(plan.shards))]
    make_durable(out, [out / fmt.SHARDS_DIR / shard_entries[i].file for i in todo] + [out / conditions["file"]])
    t_pack = time.perf_counter()
    document = fmt.index_document(
        name=manifest.name, kind=manifest.kind, encoding=manifest.format, fields=fields,
        tables=list(fmt.TABLES), shards=shard_entries,
        obs_fields=list(manifest.fields.obs_fields),
        vocabularies=plan.cells.vocabularies,
        control_labels=[c for c in manifest.fields.control if c in plan.cells.vocabularies["perturbation"]],
        conditions=conditions,
        var_names=list(scanned[0].meta.var_names),
        codec=cfg.codec.to_json() if manifest.format == "zarr" else {"name": "none", "level": 0},
        pairing={"strategy": manifest.pairing.strategy, "sentence_size": manifest.pairing.sentence_size,
                 "max_pairs_per_condition": manifest.pairing.max_pairs_per_condition},
        split={"mode": manifest.split.mode, "val_fraction": manifest.split.val_fraction,
               "test_fraction": manifest.split.test_fraction},
        sources=[{**s.fingerprint.to_json(), "ordinal": s.ordinal, "type": s.spec.type, "rows": s.meta.n_rows,
                  "matrix": s.spec.matrix} for s in scanned],
        stats={**plan.stats, "source_rows": int(sum(s.meta.n_rows for s in scanned)), "cells": len(plan.cells)},
        provenance={"manifest": str(manifest.path), "manifest_sha256": manifest.sha256, "seed": manifest.seed,
                    "shardsmith": __version__, "format_version": fmt.INDEX_VERSION},
    )
    fmt.write_index(out, document)
    save_inputs(out, manifest, scanned, plan)
    removed = collect_garbage(out, [e.file for e in shard_entries] + [conditions["file"]])
    t_end = time.perf_counter()
    written = [shard_entries[i].file for i in todo]
    log.info("committed %s: %d shards (%d written, %d reused, %d stale removed)", out, len(shard_entries),
             len(written), len(shard_entries) - len(written), removed)
    return BuildResult(out, document, written, [e.file for i, e in enumerate(shard_entries) if i not in set(todo)],
                       {"scan": t_scan - t0, "plan": t_plan - t_scan, "scatter": t_scatter - t_plan,
                        "pack": t_pack - t_scatter, "commit": t_end - t_pack, "total": t_end - t0})

