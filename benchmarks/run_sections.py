"""The sections of a benchmark run, one runner each: the data sets, the pipeline builds, the loader
tasks (each in its own interpreter), annbatch and the GPU (the spike/CT figures:
benchmarks/modality_sections.py).

Each runner takes the run's Config and folders and returns its section of results.json (a failure
or a skip is recorded there, with its reason). benchmarks/run.py calls them in order and assembles
the results, the targets and the report; it holds no measurement of its own.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import pipeline_bench as pb
from benchmarks.annbatch_bench import ENV_VAR as ANNBATCH_ENV
from benchmarks.annbatch_bench import run_annbatch, skip_record, summary_line
from benchmarks.gpu import NOT_MEASURED, cuda_available
from benchmarks.run_config import REPO, Config
from benchmarks.synth import SynthDataset, SynthParams, copy_dataset, ensure_dataset, write_manifest

CODECS = ("blosc-lz4", "blosc-zstd")


def datasets(
    cfg: Config, data_dir: Path
) -> tuple[SynthParams, dict[int, SynthDataset], SynthDataset]:
    base = SynthParams(
        n_cells=cfg.n_cells, n_genes=cfg.n_genes, n_perturbations=cfg.n_perturbations
    )
    by_size = {n: ensure_dataset(replace(base, n_cells=n), data_dir) for n in cfg.sizes}
    incr = ensure_dataset(replace(base, n_cells=cfg.incr_cells, n_files=cfg.incr_files), data_dir)
    return base, by_size, incr


def pipeline_section(
    cfg: Config,
    by_size: dict[int, SynthDataset],
    incr: SynthDataset,
    work: Path,
    roots: dict[str, Path],
) -> dict[str, Any]:
    logs, main = work / "logs", by_size[cfg.n_cells]
    mkw = {
        "sentence_size": cfg.sentence_size,
        "shard_size_mb": cfg.shard_size_mb,
        "max_pairs_per_condition": cfg.max_pairs_per_condition,
    }

    def build(label: str, ds: SynthDataset, codec: str, jobs: int) -> tuple[pb.BuildRun, Path]:
        manifest = write_manifest(
            work / f"{label}.toml", ds, name=f"bench-{label}", codec=codec, **mkw
        )
        out = work / f"shards-{label}"
        return pb.run_build(
            label,
            manifest,
            out,
            jobs,
            n_cells=ds.params.n_cells,
            codec=codec,
            source_bytes=ds.csr_bytes,
            log_dir=logs,
        ), out

    res: dict[str, Any] = {
        "codec_limit": {c: pb.codec_bound_limit(list(main.files), c) for c in CODECS}
    }
    for c, lim in res["codec_limit"].items():
        print(
            f"[limit] {c}: {lim['cells_per_s']:,.0f} cells/s, {lim['mb_per_s']:,.0f} MB/s, ratio {lim['ratio']:.2f}",
            flush=True,
        )
    sweep, main_run = [], None
    for n in sorted(cfg.sizes):
        run, out = build(
            f"size-{n}-{CODECS[0]}-j{cfg.build_jobs}", by_size[n], CODECS[0], cfg.build_jobs
        )
        sweep.append(run)
        if n == cfg.n_cells:
            main_run, roots[CODECS[0]] = run, out
        else:
            shutil.rmtree(out, ignore_errors=True)
    res["sweep"] = [r.to_json() for r in sweep]
    res["rss_flatness"] = pb.rss_flatness(sweep)
    zstd, roots[CODECS[1]] = build(
        f"size-{cfg.n_cells}-{CODECS[1]}-j{cfg.build_jobs}", main, CODECS[1], cfg.build_jobs
    )
    res["zstd"] = zstd.to_json()
    jobs_runs = {cfg.build_jobs: main_run}
    for j in cfg.jobs_compare:
        if j not in jobs_runs:
            jobs_runs[j], out = build(f"size-{cfg.n_cells}-{CODECS[0]}-j{j}", main, CODECS[0], j)
            shutil.rmtree(out, ignore_errors=True)
    res["jobs"] = [jobs_runs[j].to_json() for j in sorted(jobs_runs) if jobs_runs[j] is not None]
    if 1 in jobs_runs and 2 in jobs_runs and jobs_runs[1].ok and jobs_runs[2].ok:
        res["speedup"] = {
            "n_cells": cfg.n_cells,
            "jobs1_s": jobs_runs[1].wall_s,
            "jobs2_s": jobs_runs[2].wall_s,
            "speedup": jobs_runs[1].wall_s / jobs_runs[2].wall_s,
        }
    src = copy_dataset(incr, work / "incr-sources")
    manifest = write_manifest(work / "incr.toml", src, name="bench-incr", codec=CODECS[0], **mkw)
    res["incremental"] = pb.incremental(
        list(src.files),
        manifest,
        work / "shards-incr",
        cfg.build_jobs,
        n_cells=incr.params.n_cells,
        codec=CODECS[0],
        source_bytes=incr.csr_bytes,
        log_dir=logs,
        changed=min(3, len(src.files) - 1),
    )
    shutil.rmtree(work / "shards-incr", ignore_errors=True)
    from benchmarks.cluster_bench import backend_comparison

    res["backends"] = backend_comparison(
        manifest,
        work,
        cfg.build_jobs,
        n_cells=incr.params.n_cells,
        codec=CODECS[0],
        source_bytes=incr.csr_bytes,
        log_dir=logs,
    )
    shutil.rmtree(work / "incr-sources", ignore_errors=True)
    return res


def loader_available() -> str:
    if not (REPO / "loaders" / "loader.py").exists():
        return "loaders/loader.py not found (ShardDataset/ShardLoader not landed yet)"
    try:
        import loaders

        if not hasattr(loaders, "ShardDataset") or not hasattr(loaders, "ShardLoader"):
            return "loaders does not export ShardDataset and ShardLoader"
    except Exception as e:
        return f"cannot import loaders: {type(e).__name__}: {e}"
    return ""


def run_child(name: str, spec: dict[str, Any], work: Path, timeout: int) -> dict[str, Any]:
    """One measurement task in a fresh interpreter (its own RSS); returns its JSON document."""
    spec_path, out_path, log = (
        work / f"task-{name}.json",
        work / f"task-{name}.out.json",
        work / f"task-{name}.log",
    )
    spec_path.write_text(json.dumps(spec, indent=1))
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        try:
            rc = subprocess.run(
                [sys.executable, "-m", "benchmarks.loaders_bench", str(spec_path), str(out_path)],
                cwd=REPO,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    doc = json.loads(out_path.read_text()) if out_path.exists() else {}
    if rc != 0 and "error" not in doc:
        doc["error"] = (
            f"task exited with {rc} (timeout {timeout}s)" if rc == -1 else f"task exited with {rc}"
        )
    if doc.get("error"):
        tail = log.read_text(errors="replace")[-400:]
        print(f"[loader] {name}: FAILED {doc['error']}\n{tail}", flush=True)
    else:
        for r in doc.get("results", []):
            print(
                f"[loader] {r['method']}: {r['cells_per_s']:,.0f} cells/s, {r['mb_per_s']:,.0f} MB/s, "
                f"first batch {r['ttfb_s']:.3f}s, peak RSS {r['peak_rss_mb']:.0f} MiB {r['note']}",
                flush=True,
            )
        for r in doc.get("interleaved", {}).get("results", []):
            print(
                f"[loader] interleaved {r['method']}: {r['cells_per_s']:,.0f} cells/s"
                + (f", {r['ratio']:.2f}x {r['baseline']}" if "ratio" in r else ""),
                flush=True,
            )
    print(f"[loader] task {name} took {time.perf_counter() - t0:.1f}s", flush=True)
    return doc


def loader_section(
    cfg: Config,
    main: SynthDataset,
    roots: dict[str, Path],
    work: Path,
    skip: set[str],
    notes: list[str],
) -> dict[str, Any]:
    h5ad = str(main.files[0])
    common = {
        "h5ad": h5ad,
        "n_genes": cfg.n_genes,
        "batch_size": cfg.batch_size,
        "repeats": cfg.repeats,
        "warmup": cfg.warmup,
        "seconds": cfg.seconds,
        "sentence_batch": cfg.sentence_batch,
    }
    results: list[dict[str, Any]] = []
    out: dict[str, Any] = {"results": results, "errors": {}}
    tasks: list[tuple[str, dict[str, Any]]] = []
    if "baselines" not in skip:
        if cfg.group_baselines:
            tasks.append(
                (
                    "baselines",
                    {
                        "task": "baselines",
                        "methods": ["h5py", "anndata", "scipy"],
                        "warm_paths": [h5ad],
                    },
                )
            )
            notes.append(
                "h5py, anndata and scipy baselines ran in one interpreter (quick mode): their peak RSS "
                "figures are not isolated from each other."
            )
        else:
            tasks += [(t, {"task": t, "warm_paths": [h5ad]}) for t in ("scipy", "h5py", "anndata")]
        if "scdataset" in skip:
            notes.append("scDataset baseline skipped (--skip scdataset).")
        elif importlib.util.find_spec("scdataset") is None:
            notes.append(
                "scDataset baseline skipped: `scdataset` is not importable (pip install scdataset)."
            )
        else:
            tasks.append(
                (
                    "scdataset",
                    {
                        "task": "scdataset",
                        "warm_paths": [h5ad],
                        "scd_workers": list(cfg.scd_workers),
                        "scd_fetch_factor": 16,
                        "scd_block_size": 16,
                    },
                )
            )
    why = loader_available() if "loader" not in skip else "skipped (--skip loader)"
    if not why:
        for codec in CODECS:
            root = roots.get(codec)
            if root is None or not (root / "index.json").exists():
                notes.append(f"loader with {codec}: no shards (the build did not run or failed).")
                continue
            tasks.append(
                (
                    f"shards-{codec}",
                    {
                        "task": "shards",
                        "shards_root": str(root),
                        "codec": codec,
                        "warm_paths": [str(root)],
                        "samples": list(cfg.samples),
                        "workers": list(cfg.workers),
                    },
                )
            )
    else:
        out["skipped"] = why
        notes.append(f"our loader not measured: {why}.")
    lz4 = roots.get("blosc-lz4")
    if not why and lz4 is not None and (lz4 / "index.json").exists():
        tasks.append(
            (
                "interleaved",
                {
                    "task": "interleaved",
                    "shards_root": str(lz4),
                    "rounds": cfg.il_rounds,
                    "workers": list(cfg.il_workers),
                    "windows": list(cfg.il_windows),
                    "workers_scan": [0, 1, 2, 4],
                    "scan_window": 2,
                    "scan_epochs": 2 if cfg.mode.startswith("full") else 1,
                    "warm_paths": [str(lz4), h5ad],
                },
            )
        )
    for name, spec in tasks:
        doc = run_child(name, {**common, **spec}, work, cfg.task_timeout_s)
        if doc.get("error"):
            out["errors"][name] = doc["error"]
        results.extend(doc.get("results", []))
        if "interleaved" in doc:
            out["interleaved"] = doc["interleaved"]
    return out


def annbatch_section(
    cfg: Config,
    a: argparse.Namespace,
    main: SynthDataset,
    roots: dict[str, Path],
    data_dir: Path,
    work: Path,
    skip: set[str],
) -> dict[str, Any]:
    """annbatch paired with our loader, process by process (benchmarks/annbatch_bench.py); optional:
    a skip or failure is a record with its reason, never an exception."""
    if "annbatch" in skip:
        rec = skip_record("--skip annbatch")
    elif not cfg.mode.startswith("full") and not os.environ.get(
        ANNBATCH_ENV
    ):  # a first run installs torch: minutes
        rec = skip_record(f"smoke run: it runs in `make bench`, or here when {ANNBATCH_ENV} is set")
    elif "loader" in skip or loader_available():
        rec = skip_record("our loader is not measured in this run, nothing to pair annbatch with")
    else:
        lz4 = roots.get(CODECS[0])
        rec = run_annbatch(
            str(main.files[0]),
            str(lz4) if lz4 and (lz4 / "index.json").exists() else None,
            data_dir,
            work,
            batch_size=cfg.batch_size,
            warmup=cfg.warmup,
            seconds=cfg.seconds,
            rounds=cfg.il_rounds,
            torch_spec=a.torch_spec,
            timeout=cfg.task_timeout_s,
        )
    print(f"[loader] {summary_line(rec)}", flush=True)
    return rec


def gpu_section(
    cfg: Config, main: SynthDataset, roots: dict[str, Path], work: Path, skip: set[str]
) -> dict[str, Any]:
    """H2D, on-device densify and the CUDA loader (benchmarks/gpu.py) in a child task; only with
    CUDA."""
    if "gpu" in skip or not cuda_available():
        return {"status": NOT_MEASURED if "gpu" not in skip else "not measured (--skip gpu)"}
    root = roots.get(CODECS[0])
    doc = run_child(
        "gpu",
        {
            "task": "gpu",
            "h5ad": str(main.files[0]),
            "n_genes": cfg.n_genes,
            "batch_size": cfg.batch_size,
            "seconds": cfg.seconds,
            "warmup": cfg.warmup,
            "workers": list(cfg.workers),
            "shards_root": str(root) if root else "",
            "warm_paths": [str(root)] if root else [],
        },
        work,
        cfg.task_timeout_s,
    )
    return doc.get("gpu") or {"status": f"failed: {doc.get('error')}"}
