"""The loader of two source trees A/B: each configuration run in alternating fresh processes (A, B,
B, A, ...), one tree's ``loaders`` on ``PYTHONPATH`` each, so the VM's drift and the other jobs'
load fall on both sides alike; a figure is the median over pairs of (B / A) in the same pair.

    python -m benchmarks.experiments.loader.tree_ab SHARDS_ROOT --a /tmp/loader-old --b . [--pairs 5] [--epochs 2]

Each run is :func:`benchmarks.engine_choice.memory_one` with the default engine (the decoder
process), in the tree under test: ``epochs`` epochs of 256-cell batches, ``window=2``, persistent
workers, its process tree sampled every 50 ms (cells/s over the epochs, peak PSS, peak summed RSS).
Configurations: dense and sparse, ``num_workers`` 0 and 2 (``--workers``). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_one(tree: str, root: str, workers: int, densify: bool, epochs: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    spec = json.dumps(["decoder process", workers, densify, 2, epochs])
    args = [sys.executable, "-m", "benchmarks.engine_choice", root, "--memory-one", spec]
    out = subprocess.run(args, capture_output=True, text=True, check=True, env=env, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--a", required=True, help="the baseline tree")
    ap.add_argument("--b", default=".", help="the tree under test")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", default="0,2", help="comma list of num_workers")
    a = ap.parse_args(argv)
    configs = [(int(w), d) for w in a.workers.split(",") for d in (True, False)]
    runs: dict[str, list[dict[str, Any]]] = {}
    for i in range(a.pairs):
        for w, d in configs:
            key = f"W={w} {'dense' if d else 'sparse'}"
            order = (a.a, a.b) if i % 2 == 0 else (a.b, a.a)
            got = {tree: run_one(tree, a.root, w, d, a.epochs) for tree in order}
            runs.setdefault(key, []).append({"a": got[a.a], "b": got[a.b]})
            print(f"[ab] pair {i} {key}: {json.dumps(runs[key][-1])}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {"load_at_end": os.getloadavg(), "pairs": a.pairs}
    for key, pairs in runs.items():
        result[key] = {
            f"b/a {m}": statistics.median(p["b"][m] / p["a"][m] for p in pairs)
            for m in ("cells_per_s_alone", "peak_pss_mib", "peak_rss_sum_mib")
        }
        result[key]["a cells/s"] = statistics.median(p["a"]["cells_per_s_alone"] for p in pairs)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
