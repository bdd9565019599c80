"""`make bench-scale`: the build from 200k to 2M cells (x 2,000 genes, in .h5ad sources of up to
250k cells: 1 file at 200k, 8 at 2M; generated one file at a time by benchmarks/synth.py; the 2M
screen is ~3.3 GB), --jobs 2. Sources of a bounded size model how collections grow (more screens,
not bigger files), and keep what planning holds per source (one source's pairing and sentence
draws) the same at every size, so the peak RSS measures what the plan holds per cell of the whole
dataset.

Per size and round (``--rounds``, default 5, interleaved: limit, build, limit, build, ..., limit):
the codec-bound limit of the same files (h5py block reads + Blosc-lz4, one thread: the limit of one
job; a round's limit is the mean of the two measured just before and just after its build), then
the build through the CLI in a child process (RSS of its whole tree
sampled), with its stage times from `--log-json`. Reports cells/s per job against the limit, peak
RSS, and time against cells (a linear fit). Also the limit's floor (`pipeline_bench.codec_floor`: the
same reads and compression into reused memory, before the first round and after the last): the
limit's fresh arrays cost 3.4-4.8 CPU-s at 2M cells from run to run here, the floor 3.2-3.5, so
the build is reported against both. Writes SCALE.md and scale.json under --out (default
benchmarks/), which BENCHMARKS.md includes.

    python -m benchmarks.scale_bench                      # 200k,500k,1M,2M, 5 rounds each: ~3 min
    on 2 idle cores once the sources exist (~10 min to generate them), ~13 GB disk
    python -m benchmarks.scale_bench --sizes 200000,500000
    python -m benchmarks.scale_bench --format tar --out /tmp/scale-tar   # the same sizes in tar

Outputs stay until the last size is built: deleting thousands of files just before a build made
ext4 charge that build ~1-2 CPU-s at 2M cells (docs/PIPELINE.md, "Builds back to back").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import pipeline_bench as pb
from benchmarks.locations import RESULTS
from benchmarks.measure import machine_info
from benchmarks.synth import SynthParams, ensure_dataset, write_manifest

REPO = Path(__file__).resolve().parents[1]
STAGES = ("scanned", "planned", "tasks", "committed")


def stage_times(log: Path) -> dict[str, float]:
    """Seconds since start at which each stage ended (from the build's JSON event log)."""
    out: dict[str, float] = {}
    for line in log.read_text().splitlines():
        e = json.loads(line)
        name = e["event"] if e["event"] != "tasks" else e["phase"]
        out.setdefault(name, e["t"])
    return out


def bracket(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A round's limit: the mean of the limits measured just before and just after its build.

    Why: one limit a round moved more than the build did (3.4 to 4.6 CPU-s at 2M cells in one run,
    the build 14.7 to 16.4): the limit reads into fresh arrays and encodes into fresh bytes, so it
    pays whatever the kernel's fresh pages cost at that moment. Bracketing each build (L B L B L)
    takes the drift across the build out of its ratio, as A B A interleaving does."""
    out = dict(after)
    for key in ("seconds", "cpu_seconds", "read_seconds"):
        out[key] = (before[key] + after[key]) / 2
    out["cells_per_s"] = after["cells"] / out["seconds"]
    out["bracket_cpu_seconds"] = [before["cpu_seconds"], after["cpu_seconds"]]
    return out


def measure(
    n: int,
    data_dir: Path,
    work: Path,
    jobs: int,
    files: int,
    encoding: str = "zarr",
    rounds: int = 1,
) -> dict[str, Any]:
    """One size, ``rounds`` times: the limit, then the build (limit and build interleaved, L B L B:
    the machine's drift moves both, and the ratio is the median of the per-round ratios, as
    every figure here). Reported: the round whose CPU ratio is that median (its build, limit and
    stages), and every round's limit and build CPU-s. Outputs stay until every size is built
    (`main` deletes them): thousands of inodes freed just before a build made ext4 scan past
    them for every file the build created, ~1-2 CPU-s at 2M cells (docs/PIPELINE.md, "Builds
    back to back")."""
    ds = ensure_dataset(
        SynthParams(n_cells=n, n_genes=2_000, n_files=files, per_file=True), data_dir
    )
    manifest = write_manifest(work / f"scale-{n}.toml", ds, name=f"scale-{n}", codec="blosc-lz4")
    runs: list[dict[str, Any]] = []
    warm_page_cache(list(ds.files))
    # the floor: before the first round and after the last
    floors = [pb.codec_floor(list(ds.files), "blosc-lz4")["cpu_seconds"]]
    before = pb.codec_bound_limit(list(ds.files), "blosc-lz4", repeats=1)
    for r in range(rounds):
        out, log = work / f"shards-{n}-{encoding}-r{r}", work / f"events-{n}-r{r}.jsonl"
        shutil.rmtree(out, ignore_errors=True)
        log.unlink(missing_ok=True)
        run = pb.run_build(
            f"scale-{n}",
            manifest,
            out,
            jobs,
            n_cells=n,
            codec="blosc-lz4",
            source_bytes=ds.csr_bytes,
            log_dir=work / "logs",
            extra=("--log-json", str(log), "--format", encoding),
        )
        after = pb.codec_bound_limit(list(ds.files), "blosc-lz4", repeats=1)
        limit = bracket(before, after)
        before = after  # the next round's limit before its build
        ratio = limit["cpu_seconds"] / run.cpu_s if run.cpu_s > 0 else 0.0
        runs.append({"limit": limit, "run": run, "ratio": ratio, "log": log})
    floors.append(pb.codec_floor(list(ds.files), "blosc-lz4")["cpu_seconds"])
    floor = sum(floors) / len(floors)
    floor_ratios = [floor / x["run"].cpu_s for x in runs if x["run"].cpu_s > 0]
    mid = sorted(runs, key=lambda x: x["ratio"])[(len(runs) - 1) // 2]  # the median round
    limit, run, log = mid["limit"], mid["run"], mid["log"]
    per_job = run.cells_per_s / jobs
    res = {
        "n_cells": n,
        "files": files,
        "csr_bytes": ds.csr_bytes,
        "file_bytes": ds.file_bytes,
        "limit_cells_per_s": limit["cells_per_s"],
        "limit_s": limit["seconds"],
        "build": run.to_json(),
        "cells_per_s_per_job": per_job,
        "vs_limit": per_job / limit["cells_per_s"],
        # contention-proof: cells per CPU-second of the build (all its threads) against the limit's
        "limit_cpu_s": limit["cpu_seconds"],
        "vs_limit_cpu": mid["ratio"],
        # the same work with reused memory (pb.codec_floor): the stable floor of the limit
        "floor_cpu_s": floor,
        "floor_cpu_s_before_after": floors,
        "vs_floor_cpu": float(np.median(floor_ratios)) if floor_ratios else 0.0,
        "rounds": [
            {
                "limit_cpu_s": x["limit"]["cpu_seconds"],
                "limit_cpu_s_before_after": x["limit"]["bracket_cpu_seconds"],
                "build_cpu_s": x["run"].cpu_s,
                "build_wall_s": x["run"].wall_s,
                "peak_rss_mb": x["run"].peak_rss_mb,
                "vs_limit_cpu": x["ratio"],
            }
            for x in runs
        ],
        "stages": stage_times(log) if log.exists() else {},
    }
    ratios = [x["ratio"] for x in runs]
    print(
        f"[scale] {n:,} cells: build {run.wall_s:.1f}s, {per_job:,.0f} cells/s/job = {res['vs_limit']:.2f}x the "
        f"limit ({limit['cells_per_s']:,.0f}); per CPU-second {res['vs_limit_cpu']:.2f}x; peak RSS "
        f"{run.peak_rss_mb:.0f} MiB (median of {len(runs)} rounds: "
        f"{', '.join(f'{x:.3f}' for x in ratios)})",
        flush=True,
    )
    return res


def warm_page_cache(files: list[Path]) -> None:
    """Read every source once, untimed, so that no measurement pays for bringing them into the
    page cache: the first one at a size used to (the floor at 1M cells read 2.09 CPU-s first,
    1.50 after the rounds)."""
    buf = bytearray(8 << 20)
    for p in files:
        with open(p, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def peak_rss_mb(size: dict[str, Any]) -> float:
    """The highest peak RSS of one size's rounds (the memory rule's figure)."""
    rounds = size.get("rounds") or []
    return max((x["peak_rss_mb"] for x in rounds), default=size["build"]["peak_rss_mb"])


def markdown(doc: dict[str, Any]) -> str:
    rows = doc["sizes"]
    L = [
        "## Build at scale (`make bench-scale`)",
        "",
        f"Command: `{doc['command']}` ({doc['date']}; load average {doc['load_avg'][0]:.1f} at the start on "
        f"{doc['machine'].get('cpu_count_logical', '?')} cores). h5ad sources of up to 250k cells x 2,000 genes, "
        f"10% nonzero, `--jobs 2`, {doc.get('format', 'zarr')} shards, blosc-lz4, threads. The limit is one job's codec-bound rate on the same files "
        "(h5py 8 MiB block reads + Blosc, nothing else), measured just before and just after each build "
        "(a round's limit: their mean).",
        "",
        "`x limit (CPU)` compares cells per CPU-second (build: all its threads; limit: its one thread): what "
        "each job would reach with a core of its own, whatever the other processes on the machine take.",
        "",
        "| cells | sources (GB) | wall (s) | scan / plan / read / pack+commit (s) | cells/s per job | "
        "x limit (wall) | build CPU (s) | x limit (CPU) | peak RSS (MiB, highest round) |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b, st = r["build"], r["stages"]
        stages = (
            " / ".join(
                f"{st.get(b_, 0) - st.get(a_, 0):.1f}"
                for a_, b_ in (
                    ("start", "scanned"),
                    ("scanned", "planned"),
                    ("planned", "read sources"),
                    ("read sources", "summary"),
                )
            )
            if st
            else ""
        )
        L.append(
            f"| {r['n_cells']:,} | {r['file_bytes'] / 1e9:.2f} | {b['wall_s']:.1f} | {stages} | "
            f"{r['cells_per_s_per_job']:,.0f} | {r['vs_limit']:.2f} | {b['cpu_s']:.1f} | "
            f"{r['vs_limit_cpu']:.2f} | {peak_rss_mb(r):.0f} |"
        )
    L += [
        "",
        "Per round (limit, build, limit, ...: each build between two limits; the table shows the median "
        "round): x limit (CPU) "
        + "; ".join(
            f"{r['n_cells']:,}: " + ", ".join(f"{x['vs_limit_cpu']:.3f}" for x in r["rounds"])
            for r in rows
            if r.get("rounds")
        )
        + ".",
    ]
    floored = [r for r in rows if r.get("floor_cpu_s")]
    if floored:
        L += [
            "",
            "Against the floor (the limit's reads and compression into reused memory, measured before "
            "the first round and after the last; the limit's fresh arrays cost more or less from run "
            "to run here: docs/benchmarks/ANALYSIS.md, 26.3b): x floor (CPU) "
            + "; ".join(
                f"{r['n_cells']:,}: {r['vs_floor_cpu']:.3f} (floor {r['floor_cpu_s']:.2f} CPU-s)"
                for r in floored
            )
            + ".",
        ]
    fit = doc.get("fit")
    if fit:
        L += [
            "",
            f"Time vs cells: {fit['s_per_million']:.1f} s per million cells + {fit['intercept_s']:.1f} s "
            f"(least squares); largest/smallest time ratio {fit['time_ratio']:.2f} for {fit['cell_ratio']:.0f}x "
            f"the cells. CPU vs cells: {fit['cpu_s_per_million']:.1f} CPU-s per million cells + "
            f"{fit['cpu_intercept_s']:.1f} s (largest residual {fit['cpu_residual_max']:.0%} of the largest). "
            f"Peak RSS largest/smallest: {fit['rss_ratio']:.2f}.",
        ]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="200000,500000,1000000,2000000")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--cells-per-file",
        type=int,
        default=250_000,
        help="sources of this many cells (a bigger screen is more files, as real collections grow)",
    )
    ap.add_argument(
        "--format", default="zarr", choices=("zarr", "tar"), help="the shards' encoding"
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="builds per size, each between two limits (L B L B ... L; median ratio reported)",
    )
    ap.add_argument("--data-dir", type=Path, default=REPO / "bench_data")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    import os

    sizes = [int(s) for s in a.sizes.split(",")]
    work = a.data_dir.resolve() / "work" / "scale"
    work.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python -m benchmarks.scale_bench "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine_info(),
        "load_avg": list(os.getloadavg()),
        "jobs": a.jobs,
        "format": a.format,
    }
    try:
        doc["sizes"] = [
            measure(
                n,
                a.data_dir.resolve(),
                work,
                a.jobs,
                -(-n // a.cells_per_file),
                a.format,
                a.rounds,
            )
            for n in sizes
        ]
    finally:
        for n in sizes:
            for r in range(a.rounds):
                shutil.rmtree(work / f"shards-{n}-{a.format}-r{r}", ignore_errors=True)
    ok = [r for r in doc["sizes"] if r["build"]["rc"] == 0]
    if len(ok) >= 2:
        x = np.array([r["n_cells"] / 1e6 for r in ok])
        t = np.array([r["build"]["wall_s"] for r in ok])
        slope, icpt = np.polyfit(x, t, 1)
        rss = [peak_rss_mb(r) for r in ok]
        cpu = np.array([r["build"]["cpu_s"] for r in ok])
        cslope, cicpt = np.polyfit(x, cpu, 1)
        doc["fit"] = {
            "s_per_million": float(slope),
            "intercept_s": float(icpt),
            "time_ratio": float(t[-1] / t[0]),
            "cell_ratio": float(x[-1] / x[0]),
            "rss_ratio": float(max(rss) / min(rss)),
            "cpu_s_per_million": float(cslope),
            "cpu_intercept_s": float(cicpt),
            "cpu_residual_max": float(np.abs(cpu - (cslope * x + cicpt)).max() / cpu.max()),
        }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "scale.json").write_text(json.dumps(doc, indent=1, default=str))
    (a.out / "SCALE.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
