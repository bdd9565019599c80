"""How the CT bench measures: epoch chains of batches timed in interleaved windows, the per-item
baselines' batch loop, our loader's chain, ``shardsmith build`` in a child process (wall and peak
RSS), one volume's memory in a fresh interpreter, and bytes on disk.

Split from benchmarks/ct_bench.py so that the other benches that time builds the same way
(benchmarks/ct_formats_bench.py, benchmarks/spike_bench.py) import it without importing the CT
figures themselves (ct_bench.py imports ct_formats_bench.py: no circle).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from loaders.modalities.ct.ops import collate

REPO = Path(__file__).resolve().parents[1]


class Chain:
    """Epoch after epoch of ``make(epoch)``, counting volumes and points."""

    def __init__(self, make: Callable[[int], Iterator[Any]]) -> None:
        self.make, self.epoch, self.it = make, 0, make(0)

    def next(self) -> tuple[int, int]:
        while True:
            try:
                b = next(self.it)
            except StopIteration:
                self.epoch += 1
                self.it = self.make(self.epoch)
                continue
            coords, _, off = (b["coords"], b["feats"], b["offsets"]) if isinstance(b, dict) else b
            return int(len(off) - 1), int(coords.shape[0])


def measure_window(chain: Chain, seconds: float) -> dict[str, float]:
    vols = pts = 0
    t0 = time.perf_counter()
    while True:
        v, p = chain.next()
        vols, pts = vols + v, pts + p
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return {
                "volumes_per_s": vols / dt,
                "points_per_s": pts / dt,
                "seconds": dt,
                "volumes": vols,
            }


def interleaved(
    methods: dict[str, Chain], seconds: float, repeats: int
) -> dict[str, dict[str, Any]]:
    for c in methods.values():  # warm-up: first batch of each (imports, first decode, page cache)
        c.next()
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for _ in range(repeats):
        for m, c in methods.items():
            runs[m].append(measure_window(c, seconds))
    return {
        m: {
            "volumes_per_s": statistics.median(r["volumes_per_s"] for r in rs),
            "points_per_s": statistics.median(r["points_per_s"] for r in rs),
            "windows": rs,
        }
        for m, rs in runs.items()
    }


def item_batches(
    items: Callable[[int], dict[str, np.ndarray]], n: int, batch_size: int, epoch: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Batches of ``items(i)`` for ``i`` in a shuffled order of ``range(n)``, collated as the loader
    collates (coords, feats, offsets): the per-item and npz-cache baselines."""
    order = np.random.default_rng([0, epoch]).permutation(n)
    for j in range(0, n, batch_size):
        got = [items(int(i)) for i in order[j : j + batch_size]]
        off = np.zeros(len(got) + 1, dtype=np.int64)
        np.cumsum([g["coords"].shape[0] for g in got], out=off[1:])
        yield collate(
            np.concatenate([g["coords"] for g in got]),
            off,
            [np.concatenate([g["hu"] for g in got]), np.concatenate([g["window"] for g in got])],
        )


def shard_chain(root: Path, batch_size: int, **options: Any) -> Chain:
    """Our loader over ``root``; ``options`` are the ``ct`` sample type's (crop, flip, ...)."""
    from loaders.dataset import ShardDataset

    ds = ShardDataset(
        root, split="train", sample="ct", batch_size=batch_size, shuffle=True, seed=0, **options
    )

    def make(
        epoch: int,
    ) -> Iterator[Any]:  # one dataset for the run, as a trainer keeps it: epochs re-plan
        ds.set_epoch(epoch)
        return iter(ds)

    return Chain(make)




def build(manifest: Path, out: Path, jobs: int) -> dict[str, float]:
    """``shardsmith build`` in a child process: wall seconds and the child's peak RSS (MiB)."""
    from benchmarks.measure import RssSampler

    shutil.rmtree(out, ignore_errors=True)
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
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with RssSampler(proc.pid) as rss:
        output, _ = proc.communicate()
    dt = time.perf_counter() - t0
    text = output.decode(errors="replace")
    if proc.returncode:
        raise RuntimeError(f"build failed ({proc.returncode}): {text[-2000:]}")
    own = re.search(
        r"reused in ([0-9.]+)s", text
    )  # the build's own time, without the interpreter's start
    return {
        "seconds": dt,
        "build_seconds": float(own.group(1)) if own else dt,
        "peak_rss_mib": rss.peak / 2**20,
    }


def volume_memory(path: Path, max_points: int) -> dict[str, float]:
    """``process_volume`` on one volume in a fresh interpreter: seconds, tracemalloc peak (numpy's
    working set) and the VmHWM growth (which also counts the memory-mapped file's pages), as
    multiples of its int16 bytes."""
    code = f"""
import json, time, tracemalloc
import numpy as np
from pipeline.modalities.ct.volume import CtSettings, process_volume
def hwm():
    return int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) * 1024
base = hwm()
tracemalloc.start()
t = time.perf_counter()
rec = process_volume({str(path)!r}, CtSettings(max_points={max_points}))
dt = time.perf_counter() - t
peak = tracemalloc.get_traced_memory()[1]
vb = rec.voxels * 2
print(json.dumps({{"seconds": dt, "traced_peak_x": peak / vb, "rss_growth_x": (hwm() - base) / vb,
                  "traced_peak_mib": peak / 2**20, "rss_growth_mib": (hwm() - base) / 2**20, "points": rec.points}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
