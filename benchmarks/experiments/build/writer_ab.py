"""The zarr shard writer's two paths on real shards, interleaved in one process: zarr-python
(`pipeline.writers.zarr_writer._write_with_zarr`, the reference) against the direct path
(`pipeline.writers.zarr_direct`, what builds use), same columns, same bytes (checked), CPU and wall
per shard.

    python -m benchmarks.experiments.build.writer_ab                 # the first 3 shards of a 200k-cell scale-bench
    build, 7 rounds
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.synth import SynthParams, ensure_dataset, write_manifest

REPO = Path(__file__).resolve().parents[3]


def shard_columns(path: Path) -> dict[str, np.ndarray]:
    import zarr

    cols: dict[str, np.ndarray] = {}

    def walk(group: Any, prefix: str) -> None:
        for k, v in group.members():
            if isinstance(v, zarr.Group):
                walk(v, f"{prefix}{k}/")
            else:
                cols[prefix + k] = v[...]

    walk(zarr.open_group(str(path), mode="r"), "")
    return cols


def tree(path: Path) -> dict[str, bytes]:
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--data-dir", type=Path, default=REPO / "bench_data")
    a = ap.parse_args(argv)
    import numcodecs.blosc

    from pipeline.build import build
    from pipeline.writers import Codec
    from pipeline.writers.zarr_writer import (
        ZarrShardWriter,
        _array_like,
        _write_with_zarr,
        zarr_compressors,
    )

    ds = ensure_dataset(
        SynthParams(n_cells=200_000, n_genes=2_000, n_files=1, per_file=True), a.data_dir
    )
    work = Path(tempfile.mkdtemp(dir=a.data_dir))
    try:
        manifest = write_manifest(work / "m.toml", ds, name="writer-ab", codec="blosc-lz4")
        build(manifest, work / "out", jobs=2, progress=False)
        shards = sorted((work / "out" / "shards").iterdir())[: a.shards]
        numcodecs.blosc.set_nthreads(1)  # as pack tasks run it
        codec = Codec("blosc-lz4", 5)
        ways = {
            "zarr-python": lambda p, c: _write_with_zarr(
                p, {k: _array_like(c[k]) for k in sorted(c)}, {}, zarr_compressors(codec)
            ),
            "direct": lambda p, c: ZarrShardWriter(codec).write(p, c),
        }
        print(
            f"zarr shard writer, interleaved (load average {os.getloadavg()[0]:.1f}): `python -m "
            f"benchmarks.experiments.build.writer_ab --shards {a.shards} --rounds {a.rounds}`\n"
        )
        print(
            "| shard | MB raw | zarr-python CPU (ms) | direct CPU (ms) | CPU ratio | wall ratio |\n|---|---:|---:|---:|---:|---:|"
        )
        for shard in shards:
            cols = shard_columns(shard)
            out = {w: work / f"ab-{w}" for w in ways}
            for w, f in ways.items():  # warm (probes, imports), and the bytes must be equal
                shutil.rmtree(out[w], ignore_errors=True)
                f(out[w], cols)
            assert tree(out["zarr-python"]) == tree(out["direct"]), (
                "the two paths wrote different bytes"
            )
            cpu: dict[str, list[float]] = {w: [] for w in ways}
            wall: dict[str, list[float]] = {w: [] for w in ways}
            for i in range(a.rounds):
                for w, f in list(ways.items()) if i % 2 == 0 else list(ways.items())[::-1]:
                    shutil.rmtree(out[w])
                    c0, t0 = time.process_time(), time.perf_counter()
                    f(out[w], cols)
                    cpu[w].append(time.process_time() - c0)
                    wall[w].append(time.perf_counter() - t0)
            med = {w: (statistics.median(cpu[w]), statistics.median(wall[w])) for w in ways}
            raw = sum(c.nbytes for c in cols.values()) / 1e6
            print(
                f"| {shard.name[:24]} | {raw:.0f} | {med['zarr-python'][0] * 1e3:.0f} | {med['direct'][0] * 1e3:.0f} | "
                f"{med['zarr-python'][0] / med['direct'][0]:.2f} | {med['zarr-python'][1] / med['direct'][1]:.2f} |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
