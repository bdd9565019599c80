"""A build's before/after as an honest ratio: the CLI build of the scale bench's screens with an
earlier commit of the code (extracted with `git archive`) and with this checkout, interleaved
from one driver process (A, B, B, A, ... so neither side always runs first), medians per side and
the median of the per-round ratios.

Why: on a shared VM the same build moved by ±30% between runs minutes apart (other jobs' load);
two separate `make bench-scale` runs cannot say what a change did.

    python -m benchmarks.experiments.build.build_ab --before f804715 --sizes 200000,2000000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.measure import MIB, RssSampler
from benchmarks.pipeline_bench import _children_cpu
from benchmarks.synth import SynthParams, ensure_dataset, write_manifest

REPO = Path(__file__).resolve().parents[3]


def build_once(code: Path, manifest: Path, out: Path, jobs: int) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB of the process tree) of one CLI build with the code at `code`."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "build",
        str(manifest),
        "--out",
        str(out),
        "--jobs",
        str(jobs),
        "--no-progress",
    ]
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    sampler = RssSampler(proc.pid)
    with sampler:
        _, err = proc.communicate()
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"build with {code} failed: {err.decode(errors='replace')[-400:]}")
    shutil.rmtree(out, ignore_errors=True)
    return wall, cpu, sampler.peak / MIB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    side = ap.add_mutually_exclusive_group(required=True)
    side.add_argument("--before", help="a commit of this repository")
    # a copy of a working tree: checks an uncommitted change against the tree it was made in
    side.add_argument("--before-dir", type=Path, help="a folder holding the earlier code")
    ap.add_argument("--sizes", default="200000,2000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, default=REPO / "bench_data")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(dir=a.data_dir))
    try:
        before = work / "before"
        if a.before_dir is not None:
            shutil.copytree(a.before_dir, before)
        else:
            before.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", a.before], check=True, capture_output=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        codes = {"before": before, "after": REPO}
        load = os.getloadavg()[0]
        print(
            f"`python -m benchmarks.experiments.build.build_ab --before{'-dir' if a.before is None else ''} "
            f"{a.before or a.before_dir} --sizes {a.sizes} --rounds {a.rounds}` (load "
            f"average {load:.1f} at the start, 2 cores; --jobs {a.jobs})\n"
        )
        print(
            "| cells | wall before / after (s) | x | CPU before / after (s) | x | peak RSS before / after (MiB) |\n"
            "|---:|---|---:|---|---:|---|"
        )
        for n in (int(s) for s in a.sizes.split(",")):
            ds = ensure_dataset(
                SynthParams(n_cells=n, n_genes=2_000, n_files=-(-n // 250_000), per_file=True),
                a.data_dir,
            )
            manifest = write_manifest(work / f"ab-{n}.toml", ds, name=f"ab-{n}", codec="blosc-lz4")
            got: dict[str, list[tuple[float, float, float]]] = {"before": [], "after": []}
            for r in range(a.rounds):
                for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                    got[side].append(build_once(codes[side], manifest, work / "out", a.jobs))
            med = {
                s: [statistics.median(x[i] for x in v) for i in range(3)] for s, v in got.items()
            }
            ratio = [
                statistics.median(
                    b[i] / f[i] for b, f in zip(got["before"], got["after"], strict=True)
                )
                for i in range(2)
            ]
            print(
                f"| {n:,} | {med['before'][0]:.1f} / {med['after'][0]:.1f} | {ratio[0]:.2f} | "
                f"{med['before'][1]:.1f} / {med['after'][1]:.1f} | {ratio[1]:.2f} | "
                f"{med['before'][2]:.0f} / {med['after'][2]:.0f} |",
                flush=True,
            )
        print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
