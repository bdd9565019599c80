"""Target 26.3a: our build of the 200k-cell screen against annbatch's preshuffle of the same .h5ad
(``DatasetCollection.add_adatas`` with its defaults: a shuffled write, what annbatch asks users
to run before loading), one child process at a time: ours, annbatch, ours, annbatch ...

Why alternate processes: on a shared 2-core VM one build moves by +-30% between runs minutes
apart, so each round's ratio (annbatch seconds / our seconds, both timed inside their child,
interpreter start-up and imports excluded on both sides) is taken from two runs seconds apart,
and the figure is the median of the per-round ratios. Our child imports the libraries and
modules the build uses (`PRELOAD`) before it calls the CLI's build, as annbatch's worker imports
annbatch before its clock starts; their time is reported beside (``ours_imports_s``). Ours is
the CLI build (``--jobs 2``, threads, blosc-lz4, the bench's manifest) and its time the build's
own ``seconds`` from ``--log-json``; annbatch's is ``benchmarks/annbatch_worker.py``'s
``convert`` task, in the annbatch venv of ``benchmarks/annbatch_bench.py`` (skipped, with the
reason, where there is no Python >= 3.12 or annbatch cannot be installed).

    python -m benchmarks.build_vs_annbatch MANIFEST H5AD --rounds 7
    python -m benchmarks.build_vs_annbatch MANIFEST H5AD --rounds 8 --imports-cost
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.annbatch_bench import (
    WORKER,
    Unavailable,
    ensure_venv,
    find_python,
    run_worker,
)

REPO = Path(__file__).resolve().parents[1]
# pairs in `make bench`: with 3, one run's median moved from 1.84x to 2.12x between stops (each
# side moves +-30% here); 7 pairs (~1.5 min) gave per-pair ratios 1.91-2.79, median 2.58
ROUNDS = 7


# What annbatch's side has imported before its clock starts (annbatch imports zarr, numcodecs,
# scipy, h5py, numpy), plus what our build imports lazily once there is work (joblib, our
# modality's and writers' modules): ~0.4 s of a ~1.7 s build here, which the CLI's own `seconds`
# counted while annbatch's did not.
PRELOAD = (
    "numpy",
    "scipy.sparse",
    "h5py",
    "zarr",
    "numcodecs",
    "joblib",
    "pipeline.build",
    "pipeline.modalities.perturbation.kind",
    "pipeline.modalities.perturbation.pack",
    "pipeline.modalities.perturbation.plan",
    "pipeline.modalities.perturbation.h5ad",
    "pipeline.writers.zarr_writer",
    "pipeline.writers.tar_writer",
)
# the child: import PRELOAD, say how long that took (stderr), then the CLI's build in-process
CHILD = """
import importlib, json, sys, time
t = time.perf_counter()
for m in filter(None, sys.argv[1].split(",")):
    importlib.import_module(m)
print(json.dumps({"imports_s": time.perf_counter() - t}), file=sys.stderr, flush=True)
from pipeline.cli import main
sys.exit(main(sys.argv[2:]))
"""


def ours_once(
    manifest: Path, out: Path, jobs: int, preload: tuple[str, ...] = PRELOAD
) -> tuple[float, float]:
    """(seconds of one CLI build into an empty `out`, as the build reports them; seconds of the
    imports done before it) -- the build runs in a child that imported `preload` first, as
    annbatch's worker imports annbatch before its clock starts."""
    shutil.rmtree(out, ignore_errors=True)
    log = out.with_suffix(".events.jsonl")
    log.unlink(missing_ok=True)  # --log-json appends
    cmd = [sys.executable, "-c", CHILD, ",".join(preload), "build", str(manifest), "--out"]
    cmd += [str(out), "--jobs", str(jobs), "--no-progress", "--log-json", str(log)]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"our build failed: {p.stderr.strip()[-300:]}")
    imports = next(
        json.loads(line)["imports_s"] for line in p.stderr.splitlines() if '"imports_s"' in line
    )
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    shutil.rmtree(out, ignore_errors=True)
    seconds = next(e["seconds"] for e in events if e.get("event") == "summary")
    return float(seconds), float(imports)


def measure(
    manifest: Path,
    h5ad: Path,
    data_dir: Path,
    rounds: int,
    jobs: int = 2,
    torch: str = "torch==2.13.0",
) -> dict[str, Any]:
    """``rounds`` pairs (ours, annbatch); a record with ``skipped`` when annbatch cannot run."""
    py = find_python()
    if isinstance(py, str):
        return {"skipped": py}
    try:
        vpy = ensure_venv(py, data_dir / "annbatch", torch)
    except Unavailable as e:
        return {"skipped": str(e)}
    ours, theirs, imports = [], [], []
    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
        work = Path(tmp)
        for r in range(rounds):
            seconds, imported = ours_once(manifest, work / "ours", jobs)
            ours.append(seconds)
            imports.append(imported)
            dest = work / f"annbatch-{r}.zarr"
            doc = run_worker(
                [vpy, "-I", str(WORKER)],
                "convert",
                {"h5ad": str(h5ad), "collection": str(dest)},
                work,
                f"build-{r}",
                1200,
            )
            if doc.get("error"):
                return {"skipped": f"annbatch's convert failed: {doc['error']}"}
            theirs.append(float(doc["convert_s"]))
            shutil.rmtree(dest, ignore_errors=True)
    ratios = [a / o for o, a in zip(ours, theirs, strict=True)]
    return {
        "ours_s": ours,
        "annbatch_s": theirs,
        "ours_imports_s": imports,  # done before our clock, as on annbatch's side
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        "jobs": jobs,
        "h5ad": str(h5ad),
        "load_avg": list(os.getloadavg()),
    }


def imports_cost(manifest: Path, rounds: int, jobs: int = 2) -> dict[str, Any]:
    """What `PRELOAD` takes off our build's own `seconds`: the build with nothing imported first
    (as users run the CLI) and with `PRELOAD` first, alternating; per-round differences."""
    lazy, first = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for pre in (True, False) if r % 2 == 0 else (False, True):
                seconds, _ = ours_once(manifest, Path(tmp) / "ours", jobs, PRELOAD if pre else ())
                (first if pre else lazy).append(seconds)
    diffs = [a - b for a, b in zip(lazy, first, strict=True)]
    return {
        "lazy_s": lazy,
        "preloaded_s": first,
        "diffs": diffs,
        "median": statistics.median(diffs),
    }


def build_annbatch_section(
    cfg: Any, main_h5ad: Path, work: Path, data_dir: Path, skip: set[str], torch: str
) -> dict[str, Any]:
    """`make bench`'s 26.3a figure (benchmarks/run.py): the main screen's manifest as the pipeline
    section wrote it; a skip or failure is a record with its reason, never an exception."""
    if "annbatch" in skip or "pipeline" in skip:
        return {"skipped": "--skip annbatch" if "annbatch" in skip else "--skip pipeline"}
    if not cfg.mode.startswith("full"):
        return {"skipped": "smoke run: it runs in `make bench`"}
    manifest = work / f"size-{cfg.n_cells}-blosc-lz4-j{cfg.build_jobs}.toml"
    if not manifest.exists():
        return {"skipped": f"no manifest {manifest.name} (the pipeline section did not run)"}
    print("[bench] build vs annbatch's preshuffle (26.3a)", flush=True)
    try:
        return measure(manifest, main_h5ad, data_dir, ROUNDS, cfg.build_jobs, torch)
    except Exception as e:  # report what broke; the rest of the run stands
        return {"skipped": f"{type(e).__name__}: {e}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("manifest", type=Path)
    ap.add_argument("h5ad", type=Path)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, default=REPO / "bench_data")
    ap.add_argument(
        "--imports-cost", action="store_true", help="only time our build with and without PRELOAD"
    )
    a = ap.parse_args(argv)
    if a.imports_cost:
        print(json.dumps(imports_cost(a.manifest, a.rounds, a.jobs)), flush=True)
        return 0
    print(json.dumps(measure(a.manifest, a.h5ad, a.data_dir, a.rounds, a.jobs)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
