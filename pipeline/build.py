"""The staged build: scan -> plan -> scatter -> pack -> commit. index.json is written last (the commit point);
until then the previous dataset in OUT stays intact and readable, whatever fails and whenever."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from joblib import Parallel, delayed, parallel_config
from tqdm.auto import tqdm

from loaders import format as fmt
from pipeline import __version__
from pipeline.manifest import Manifest, load_manifest
from pipeline.pack import PackConfig, make_durable, pack_shard, scatter_source, write_columns
from pipeline.plan import Plan, make_plan
from pipeline.scan import ScannedSource, scan
from pipeline.writers import Codec, get_writer

log = logging.getLogger(__name__)
T = TypeVar("T")
BACKENDS = ("loky", "threading", "dask", "ray")


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
    if not tasks:
        return []
    if jobs == 1 or len(tasks) == 1:
        return [t() for t in tqdm(tasks, desc=desc, unit="task", disable=not progress)]
    with parallel_config(backend=backend, n_jobs=jobs):
        gen = Parallel(return_as="generator")(delayed(t)() for t in tasks)
        return list(tqdm(gen, total=len(tasks), desc=desc, unit="task", disable=not progress))


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
    cond = plan.conditions
    columns = {"vectors": cond.vectors, "codes": cond.codes}
    import hashlib

    h = hashlib.sha256(cond.vectors.tobytes() + cond.codes.tobytes()).hexdigest()[:16]
    final = out / f"conditions-{h}{get_writer(cfg.encoding, cfg.codec).suffix}"
    digest, stored = write_columns(columns, final, cfg)
    return {"file": final.name, "sha256": digest, "bytes": stored, "n": int(cond.vectors.shape[0]),
            "dim": int(cond.vectors.shape[1]), "segments": cond.segments}


def collect_garbage(out: Path, keep: Iterable[str]) -> int:
    """After a commit: remove shards and condition tables the new index no longer references."""
    keep = set(keep)
    removed = 0
    candidates = list((out / fmt.SHARDS_DIR).iterdir()) + list(out.glob("conditions-*"))
    for p in candidates:
        name = p.name if p.parent.name != fmt.SHARDS_DIR else p.name
        if name in keep:
            continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        removed += 1
    return removed


def build(manifest_path: str | Path, out: str | Path | None = None, jobs: int | None = None,
          backend: str = "loky", scheduler: str | None = None, progress: bool = True) -> BuildResult:
    t0 = time.perf_counter()
    manifest = load_manifest(manifest_path)
    out = Path(out) if out is not None else Path("shards") / manifest.name
    jobs = jobs or os.cpu_count() or 1
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (expected one of {BACKENDS})")
    prev = previous_index(out)
    cache = {s["path"]: s for s in (prev or {}).get("sources", [])}
    scanned = scan(manifest, cache)
    t_scan = time.perf_counter()
    plan = make_plan(manifest, scanned)
    t_plan = time.perf_counter()

    (out / fmt.SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    spill = out / f".spill-{os.getpid()}"
    fields = dataset_fields(manifest, scanned)
    cfg = PackConfig(out=out, spill=spill, encoding=manifest.format, codec=Codec(manifest.codec, manifest.codec_level),
                     counts=manifest.fields.values == "counts", obsm=manifest.fields.obsm, fields=fields,
                     block_rows=manifest.block_rows)
    reusable = {s["plan_key"]: fmt.ShardEntry.from_json(s) for s in (prev or {}).get("shards", [])
                if (out / fmt.SHARDS_DIR / s["file"]).exists()}
    todo = [i for i, sh in enumerate(plan.shards) if sh.key not in reusable]
    entries: dict[int, fmt.ShardEntry] = {i: reusable[sh.key] for i, sh in enumerate(plan.shards) if sh.key in reusable}
    ctx = _backend_context(backend, scheduler)
    try:
        spill.mkdir(exist_ok=True)
        conditions = write_conditions(out, plan, cfg)
        by_source: dict[int, list[tuple[int, np.ndarray]]] = {}
        for i in todo:
            by_source.setdefault(plan.shards[i].source, []).append((i, plan.shards[i].rows))
        scatter = [_bind(scatter_source, scanned[s].spec, scanned[s].meta.n_rows, t, cfg) for s, t in by_source.items()]
        _run(jobs, backend, scatter, "read sources", progress)
        t_scatter = time.perf_counter()
        packed = _run(jobs, backend, [_bind(pack_shard, i, plan.shards[i], cfg) for i in todo], "pack shards", progress)
        entries.update(zip(todo, packed, strict=True))
    finally:
        shutil.rmtree(spill, ignore_errors=True)
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
                    "shardsmith": __version__, "format_version": fmt.FORMAT_VERSION},
    )
    fmt.write_index(out, document)
    removed = collect_garbage(out, [e.file for e in shard_entries] + [conditions["file"]])
    t_end = time.perf_counter()
    written = [shard_entries[i].file for i in todo]
    log.info("committed %s: %d shards (%d written, %d reused, %d stale removed)", out, len(shard_entries),
             len(written), len(shard_entries) - len(written), removed)
    return BuildResult(out, document, written, [e.file for i, e in enumerate(shard_entries) if i not in set(todo)],
                       {"scan": t_scan - t0, "plan": t_plan - t_scan, "scatter": t_scatter - t_plan,
                        "pack": t_pack - t_scatter, "commit": t_end - t_pack, "total": t_end - t0})


def _bind(fn: Callable[..., T], *args: Any) -> Callable[[], T]:
    """A picklable zero-argument task (joblib ships it to a worker process)."""
    import functools

    return functools.partial(fn, *args)
