"""The build on each backend (threading, loky, a dask LocalCluster), same dataset and --jobs: wall
time, peak RSS of the whole process tree (cluster workers included), and whether the shards are
byte-identical.

Why a separate measurement: a cluster backend pays for starting its workers and for sending tasks
(here descriptors: paths and row ranges, see pipeline/taskspill.py), which a thread pool does
not; on one machine that overhead is all a cluster adds, so this is its price, not a speed-up.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

from benchmarks import pipeline_bench as pb

BACKENDS = {"threading": "joblib", "loky": "joblib", "dask": "distributed", "ray": "ray"}


def backend_comparison(
    manifest: Path,
    work: Path,
    jobs: int,
    *,
    n_cells: int,
    codec: str,
    source_bytes: int,
    log_dir: Path,
    backends: tuple[str, ...] = ("threading", "loky", "dask"),
) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    hashes: dict[str, dict[str, str]] = {}
    for backend in backends:
        if importlib.util.find_spec(BACKENDS[backend]) is None:
            runs[backend] = {"skipped": f"{BACKENDS[backend]} is not installed"}
            continue
        out = work / f"shards-backend-{backend}"
        shutil.rmtree(out, ignore_errors=True)
        run = pb.run_build(
            f"backend-{backend}-j{jobs}",
            manifest,
            out,
            jobs,
            n_cells=n_cells,
            codec=codec,
            source_bytes=source_bytes,
            log_dir=log_dir,
            extra=("--backend", backend),
        )
        runs[backend] = run.to_json()
        if run.ok:
            hashes[backend] = pb.shard_hashes(out)
        shutil.rmtree(out, ignore_errors=True)
    same = len({tuple(sorted(h.items())) for h in hashes.values()}) == 1 if hashes else None
    return {"jobs": jobs, "n_cells": n_cells, "runs": runs, "byte_identical": same}


def markdown(res: dict[str, Any]) -> list[str]:
    if not res or not res.get("runs"):
        return []
    L = [
        f"Backends ({res['n_cells']:,} cells, `--jobs {res['jobs']}`, `--backend NAME`; dask without "
        "`--scheduler` starts a LocalCluster on 127.0.0.1; wall time includes starting it). Shards byte-identical "
        f"across backends: **{res['byte_identical']}**.",
        "",
        "| backend | wall (s) | cells/s | peak RSS (MiB, process tree) |",
        "|---|---:|---:|---:|",
    ]
    for name, r in res["runs"].items():
        if "skipped" in r:
            L.append(f"| {name} | skipped: {r['skipped']} | | |")
        elif r.get("rc", 1) != 0:
            L.append(f"| {name} | FAILED: {r.get('error', '')} | | |")
        else:
            L.append(
                f"| {name} | {r['wall_s']:.1f} | {r['cells_per_s']:,.0f} | {r['peak_rss_mb']:.0f} |"
            )
    return L


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.cluster_bench --cells N --files K --jobs J`: the backend comparison
    alone, plus the dry run's time (before the first build: scan + hash + plan; after it: the
    no-change check)."""
    import argparse
    import json
    import sys

    from benchmarks.synth import SynthParams, ensure_dataset, write_manifest

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--cells", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--data-dir", type=Path, default=Path(__file__).resolve().parents[1] / "bench_data"
    )
    a = ap.parse_args(argv)
    ds = ensure_dataset(
        SynthParams(n_cells=a.cells, n_genes=2_000, n_files=a.files, per_file=True),
        a.data_dir.resolve(),
    )
    work = a.data_dir.resolve() / "work" / "backends"
    work.mkdir(parents=True, exist_ok=True)
    manifest = write_manifest(work / "m.toml", ds, name="backends", codec="blosc-lz4")
    kw = {
        "n_cells": a.cells,
        "codec": "blosc-lz4",
        "source_bytes": ds.csr_bytes,
        "log_dir": work / "logs",
    }
    out = work / "shards-dry"
    shutil.rmtree(out, ignore_errors=True)
    dry_first = pb.run_build("dry-run-first", manifest, out, a.jobs, extra=("--dry-run",), **kw)
    res = backend_comparison(manifest, work, a.jobs, **kw)
    pb.run_build("built", manifest, out, a.jobs, **kw)
    dry_again = pb.run_build("dry-run-nochange", manifest, out, a.jobs, extra=("--dry-run",), **kw)
    shutil.rmtree(out, ignore_errors=True)
    res["dry_run"] = {
        "first_s": dry_first.wall_s,
        "first_cpu_s": dry_first.cpu_s,
        "first_peak_rss_mb": dry_first.peak_rss_mb,
        "nochange_s": dry_again.wall_s,
    }
    res["command"] = "python -m benchmarks.cluster_bench " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    print(json.dumps(res, indent=1, default=str))
    print("\n".join(markdown(res)))
    print(
        f"\n`--dry-run` ({a.cells:,} cells, {a.files} files): {dry_first.wall_s:.1f}s before the first build "
        f"(scan, sha256 of every source, plan; {dry_first.cpu_s:.1f} CPU-s, peak RSS {dry_first.peak_rss_mb:.0f} "
        f"MiB), {dry_again.wall_s:.2f}s once built (the no-change check)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
