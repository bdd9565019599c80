"""`shardsmith report` over the bench screen (the main blosc-lz4 build): its time against the
build's (issue 47: at most 5%), and the page's size.

Run by benchmarks/run.py in a child interpreter, after the pipeline section built the screen:
``python -m benchmarks.report_bench ROOT --rounds N`` prints one JSON line. Two figures: the report
in process (summary, shard columns, plots, the three files written; median of N rounds, imports
paid once before), judged against the build's own time as its CLI prints it (also without the
interpreter's start); and the whole `shardsmith report` process once, beside the build's whole
process, as detail.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.verdicts import target

GOAL = 0.05  # report time / build time of the bench screen


def measure(root: Path, rounds: int) -> dict[str, Any]:
    from pipeline.report.build import build_report, outputs, write_report

    out = Path(tempfile.mkdtemp(prefix="report-bench-")) / "screen.html"
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        write_report(build_report(root, str(root)), out)
        times.append(time.perf_counter() - t)
    t = time.perf_counter()
    cli = subprocess.run(
        [sys.executable, "-m", "pipeline", "report", str(root), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    cli_s = time.perf_counter() - t
    page, data, mqc = outputs(out)
    return {
        "report_s": statistics.median(times),
        "rounds": times,
        "cli_wall_s": cli_s if cli.returncode == 0 else None,
        "cli_error": cli.stderr[-300:] if cli.returncode else "",
        "page_bytes": page.stat().st_size,
        "json_bytes": data.stat().st_size,
        "mqc_bytes": mqc.stat().st_size,
    }


def report_section(
    cfg: Any, roots: dict[str, Path], res: dict[str, Any], skip: set[str], notes: list[str]
) -> dict[str, Any]:
    """The child run over the main blosc-lz4 build, with that build's times beside it."""
    if "report" in skip:
        return {"skipped": "--skip report"}
    root = roots.get("blosc-lz4")
    if root is None or not (root / "index.json").exists():
        return {"skipped": "no blosc-lz4 build (the pipeline section did not run)"}
    rounds = 5 if cfg.mode == "full" else 2
    print("[bench] report (shardsmith report over the bench screen)", flush=True)
    cmd = [sys.executable, "-m", "benchmarks.report_bench", str(root), "--rounds", str(rounds)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.task_timeout_s)
        if p.returncode != 0:
            raise RuntimeError(f"exit {p.returncode}: {p.stderr.strip()[-300:]}")
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception as e:  # report what broke; the rest of the run stands
        notes.append(f"report not measured: {type(e).__name__}: {e}")
        return {"skipped": f"{type(e).__name__}: {e}"}
    runs = (res.get("pipeline") or {}).get("sweep") or []
    main = next((r for r in runs if r.get("n_cells") == cfg.n_cells and r.get("rc") == 0), None)
    if main is not None:
        out["build_label"] = main["label"]
        out["build_internal_s"], out["build_wall_s"] = main["internal_s"], main["wall_s"]
    print(f"[report] {json.dumps(out)}", flush=True)
    return out


def report_targets(rep: dict[str, Any]) -> list[dict[str, Any]]:
    build = rep.get("build_internal_s") or 0
    value = rep["report_s"] / build if build > 0 and rep.get("report_s") is not None else None
    wall = (
        f"; whole processes: report {rep['cli_wall_s']:.2f} s, build {rep['build_wall_s']:.2f} s"
        if rep.get("cli_wall_s") and rep.get("build_wall_s")
        else ""
    )
    return [
        target(
            "47",
            "shardsmith report of the bench screen / its build, both in process (<= 5%)",
            value,
            GOAL,
            False,
            detail=f"report {rep.get('report_s', 0):.3f} s vs build {build:.2f} s "
            f"({rep.get('build_label', '-')}); page {rep.get('page_bytes', 0) / 1e3:.0f} kB{wall}"
            if value is not None
            else rep.get("skipped", "no build time to compare with"),
        )
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    print(json.dumps(measure(a.root, a.rounds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
