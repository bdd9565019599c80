"""Where the benchmarks' results live: ``docs/benchmarks/`` (results.json, scale.json, plots/,
device/, ANALYSIS.md, SCALE.md), next to the other documents and out of the code folder, so that
benchmarks/ holds only the suite's code. One place names it, for every writer and reader."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS_REL = Path("docs") / "benchmarks"  # under a run's --out (`make bench`: --out .)
RESULTS = REPO / RESULTS_REL  # this checkout's recorded results
