"""The build on each backend (threading, loky, a dask LocalCluster), same dataset and --jobs: wall time, peak
RSS of the whole process tree (cluster workers included), and whether the shards are byte-identical.

Why a separate measurement: a cluster backend pays for starting its workers and for sending tasks (here
descriptors: paths and row ranges, see pipeline/taskspill.py), which a thread pool does not; on one machine
that overhead is all a cluster adds, so this is its price, not a speed-up.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

from benchmarks import pipeline_bench as pb

BACKENDS = {"threading": "joblib", "loky": "joblib", "dask": "distributed", "ray": "ray"}


def backend_comparison(manifest: Path, work: Path, jobs: int, *, n_cells: int, codec: str, source_bytes: int,
                       log_dir: Path, backends: tuple[str, ...] = ("threading", "loky", "dask")) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    hashes: dict[str, dict[str, str]] = {}
    for backend in backends:
        if importlib.util.find_spec(BACKENDS[backend]) is None:
            runs[backend] = {"skipped": f"{BACKENDS[backend]} is not installed"}
            continue
        out = work / f"shards-backend-{backend}"
        shutil.rmtree(out, ignore_errors=True)
        run = pb.run_build(f"backend-{backend}-j{jobs}", manifest, out, jobs, n_cells=n_cells, codec=codec,
                           source_bytes=source_bytes, log_dir=log_dir, extra=("--backend", backend))
        runs[backend] = run.to_json()
        if run.ok:
            hashes[backend] = pb.shard_hashes(out)
        shutil.rmtree(out, ignore_errors=True)
    same = len({tuple(sorted(h.items())) for h in hashes.values()}) == 1 if hashes else None
    return {"jobs": jobs, "n_cells": n_cells, "runs": runs, "byte_identical": same}


def markdown(res: dict[str, Any]) -> list[str]:
    if not res or not res.get("runs"):
        return []
    L = [f"Backends ({res['n_cells']:,} cells, `--jobs {res['jobs']}`, `--backend NAME`; dask without "
         "`--scheduler` starts a LocalCluster on 127.0.0.1; wall time includes starting it). Shards byte-identical "
         f"across backends: **{res['byte_identical']}**.", "",
         "| backend | wall (s) | cells/s | peak RSS (MiB, process tree) |", "|---|---:|---:|---:|"]
    for name, r in res["runs"].items():
        if "skipped" in r:
            L.append(f"| {name} | skipped: {r['skipped']} | | |")
        elif r.get("rc", 1) != 0:
            L.append(f"| {name} | FAILED: {r.get('error', '')} | | |")
        else:
            L.append(f"| {name} | {r['wall_s']:.1f} | {r['cells_per_s']:,.0f} | {r['peak_rss_mb']:.0f} |")
    return L
