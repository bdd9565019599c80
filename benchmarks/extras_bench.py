"""`make bench`'s loader extras, on the run's main blosc-lz4 build, in ONE child interpreter:

* **persistent workers by default** (issue 26.5): ``ShardLoader(num_workers=2)`` with default
  settings against ``persistent_workers=True`` and ``persistent_workers=False``
  (:mod:`benchmarks.persistent_ab`'s streams: endless chains of epochs, ``set_epoch`` each),
  windows of ``--seconds`` taking turns (A B C A B C ...) for ``--rounds`` rounds; ratios are the
  median over rounds of (window / the ``persistent_workers=True`` window of the same round);
* **digest check on read** (issue 26.1): the CPU of checking one window's shards' xxh3-128
  digests as the loader does (:func:`benchmarks.integrity_bench.window_digest_cpu`) against the
  same window's in-process decode (``verify=False``; wall and process CPU: codec threads
  included), median of ``--rounds``.

    python -m benchmarks.extras_bench SHARDS_ROOT [--seconds 3] [--rounds 5] [--window 4]

Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORKERS = 2


def persistent(root: str, seconds: float, rounds: int) -> dict[str, Any]:
    from benchmarks.persistent_ab import loader_stream

    streams = [
        loader_stream(root, WORKERS),
        loader_stream(root, WORKERS, persistent_workers=True),
        loader_stream(root, WORKERS, persistent_workers=False),
    ]
    try:
        for s in streams:
            s.start(2)
        for _ in range(rounds):
            for s in streams:
                s.window(seconds)
    finally:
        for s in streams:
            close = getattr(s.it, "close", None)
            if close is not None:
                close()
    ref = streams[1]
    out: dict[str, Any] = {"seconds": seconds, "rounds": rounds, "num_workers": WORKERS}
    for key, s in zip(("default", "true", "false"), streams, strict=True):
        ratios = [x / y for x, y in zip(s.windows, ref.windows, strict=True)]
        out[key] = {
            "method": s.name,
            "cells_per_s": statistics.median(s.windows),
            "epochs": getattr(s.it, "epochs", 0),
            "vs_persistent": statistics.median(ratios),
            "ratios": ratios,
        }
    return out


def digest_cost(root: str, window: int, rounds: int) -> dict[str, Any]:
    from benchmarks.integrity_bench import window_digest_cpu
    from loaders import ShardDataset
    from loaders.samples.arena import BufferPool

    ds = ShardDataset(root, split="train", batch_size=256, window=window, seed=0, verify=False)
    reader, pool = ds.reader, BufferPool()
    wall, cpu = [], []
    for e in range(rounds + 1):  # the first decode warms up (page cache, allocations)
        t0, c0 = time.perf_counter(), time.process_time()
        arena = reader.read_window(e, 0, pool)
        t1, c1 = time.perf_counter(), time.process_time()
        arena.release(pool)
        if e:
            wall.append(t1 - t0)
            cpu.append(c1 - c0)
    n = min(window, len(reader.paths))
    hashed = window_digest_cpu(reader, n, rounds)
    stored = sum(e.bytes for e in reader.entries[:n])
    dec_cpu = statistics.median(cpu)
    return {
        "window_shards": n,
        "stored_mb": stored / 1e6,
        "xxh3_cpu_s": hashed["xxh3_128"],
        "sha256_cpu_s": hashed["sha256"],
        "decode_wall_s": statistics.median(wall),
        "decode_cpu_s": dec_cpu,
        "xxh3_over_decode_cpu": hashed["xxh3_128"] / max(dec_cpu, 1e-9),
    }


def extras_section(
    cfg: Any, roots: dict[str, Path], skip: set[str], notes: list[str]
) -> dict[str, Any]:
    """Run this module in a child interpreter over the main blosc-lz4 build (benchmarks/run.py)."""
    if "extras" in skip or "loader" in skip:
        return {"skipped": "--skip extras" if "extras" in skip else "--skip loader"}
    root = roots.get("blosc-lz4")
    if root is None or not (root / "index.json").exists():
        return {"skipped": "no blosc-lz4 build (the pipeline section did not run)"}
    full = cfg.mode == "full"
    seconds, rounds = (3.0, 5) if full else (max(0.1, cfg.seconds), 2)
    print("[bench] extras (persistent workers A/B, digest check vs decode)", flush=True)
    cmd = [sys.executable, "-m", "benchmarks.extras_bench", str(root)]
    cmd += ["--seconds", str(seconds), "--rounds", str(rounds)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.task_timeout_s)
        if p.returncode != 0:
            raise RuntimeError(f"exit {p.returncode}: {p.stderr.strip()[-300:]}")
        res = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception as e:  # report what broke; the rest of the run stands
        notes.append(f"loader extras not measured: {type(e).__name__}: {e}")
        return {"skipped": f"{type(e).__name__}: {e}"}
    print(f"[extras] {json.dumps(res)}", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=int, default=4)
    a = ap.parse_args(argv)
    out: dict[str, Any] = {}
    for key, fn, args in (
        ("persistent", persistent, (a.root, a.seconds, a.rounds)),
        ("digest", digest_cost, (a.root, a.window, a.rounds)),
    ):
        try:
            out[key] = fn(*args)
        except Exception as e:  # one figure failing leaves the other
            out[key] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
