"""Where a build's CPU goes, against the codec-bound limit: `build()` of the scale bench's screen
(sources of 250k cells x 2,000 genes) under cProfile, in this process, at `--jobs 1` (no threads:
every CPU-second is attributed once; the hasher's source digest runs inline in the scan), split
into the components the limit has (h5py block reads, Blosc) and everything else the format and
the design add.

    python -m benchmarks.experiments.build.build_profile                    # 1M cells (4 sources), ~25 s
    python -m benchmarks.experiments.build.build_profile --cells 2000000

Leaf functions are attributed by their tottime (split by caller where one function serves several
parts, e.g. sha256 of sources, shards and plan keys); the stages by their cumulative time.
The profiler's clock is the process's CPU time (a loaded machine's waits for a core would
otherwise count): the C-level leaves are timed as they run, but every Python-level call pays a
clock read, so code made of many small Python calls is inflated (zarr's metadata serialisation:
3.4 ms a call under the profiler, 0.13 ms without) and lands in "everything else".
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import pipeline_bench as pb
from benchmarks.synth import SynthParams, ensure_dataset, write_manifest

REPO = Path(__file__).resolve().parents[3]
# component -> (file suffix, function name[, caller function name]) of the leaves it owns (tottime)
LEAVES: dict[str, list[tuple[str, ...]]] = {
    "h5py reads (limit: block reads)": [("h5py/_hl/dataset.py", "__getitem__")],
    "Blosc encode (limit: X; also the plan's tables)": [("zarr_direct.py", "encode")],
    # xxh3-128 from index version 4 (loaders.format.digests); sha256 when profiling an older checkout
    "digest of sources (fingerprints)": [
        ("~", "<method 'update' of '_hashlib.HASH' objects>", "file_digest"),
        ("~", "<method 'update' of 'xxhash.xxh3_128' objects>", "file_digest"),
        ("~", "<method 'readinto' of '_io.BufferedReader' objects>", "file_digest"),
        # from a reused buffer (loaders.format.digests.feed_file)
        ("~", "<method 'update' of 'xxhash.xxh3_128' objects>", "feed_file"),
        ("~", "<method 'readinto' of '_io.FileIO' objects>", "feed_file"),
    ],
    "digest of shards (index hashes)": [
        ("~", "<method 'update' of '_hashlib.HASH' objects>", "content_hash"),
        ("~", "<method 'update' of 'xxhash.xxh3_128' objects>", "content_hash"),
        ("~", "<method 'read' of '_io.BufferedReader' objects>", "<lambda>"),
        # mapped windows of the files just written (loaders.format.digests.feed_mapped)
        ("~", "<method 'update' of 'xxhash.xxh3_128' objects>", "feed_mapped"),
    ],
    "sha256 of plan keys": [("~", "<method 'update' of '_hashlib.HASH' objects>", "plan_key")],
    "row gathers (scatter + pack)": [
        ("~", "<built-in method scipy.sparse._sparsetools.csr_row_index>")
    ],
    "spill I/O (write, read, delete)": [
        ("~", "<method 'tofile' of 'numpy.ndarray' objects>"),
        ("~", "<built-in method posix.preadv>"),
        ("~", "<built-in method numpy.fromfile>"),
        ("~", "<built-in method posix.unlink>"),
    ],
    "shard files (open, write, mkdir)": [
        ("~", "<built-in method posix.open>"),
        ("~", "<built-in method posix.write>"),
        ("~", "<built-in method posix.mkdir>"),
    ],
}
STAGES = {
    "scan (with source digests)": ("pipeline/modalities/perturbation/kind.py", "scan"),
    "plan": ("pipeline/modalities/perturbation/kind.py", "plan"),
    "read tasks (read, validate, route, spill)": (
        "pipeline/modalities/perturbation/pack.py",
        "_scatter",
    ),
    "pack tasks (gather, encode, write, hash)": (
        "pipeline/modalities/perturbation/pack.py",
        "_pack",
    ),
}


def _match(key: tuple[str, int, str], file: str, name: str) -> bool:
    return key[2] == name and (file == "~" or key[0].endswith(file))


def leaf_seconds(stats: dict[Any, Any], spec: tuple[str, ...]) -> float:
    total = 0.0
    for key, (_cc, _nc, tt, _ct, callers) in stats.items():
        if not _match(key, spec[0], spec[1]):
            continue
        if len(spec) == 2:
            total += tt
        else:
            total += sum(edge[2] for caller, edge in callers.items() if caller[2] == spec[2])
    return total


def stage_seconds(stats: dict[Any, Any], file: str, name: str) -> float:
    return sum(v[3] for k, v in stats.items() if _match(k, file, name))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cells", type=int, default=1_000_000)
    ap.add_argument("--cells-per-file", type=int, default=250_000)
    ap.add_argument("--data-dir", type=Path, default=REPO / "bench_data")
    a = ap.parse_args(argv)
    from pipeline.build import build

    files = -(-a.cells // a.cells_per_file)
    ds = ensure_dataset(
        SynthParams(n_cells=a.cells, n_genes=2_000, n_files=files, per_file=True), a.data_dir
    )
    work = a.data_dir.resolve() / "work" / "profile"
    manifest = write_manifest(
        work / f"profile-{a.cells}.toml", ds, name=f"profile-{a.cells}", codec="blosc-lz4"
    )
    limit = pb.codec_bound_limit(list(ds.files), "blosc-lz4", repeats=1)
    out = work / "shards"
    shutil.rmtree(out, ignore_errors=True)
    # CPU time, not wall: on a loaded machine wall-clock leaves count time spent waiting for a core
    prof = cProfile.Profile(time.process_time)
    c0, t0 = time.process_time(), time.perf_counter()
    prof.enable()
    build(manifest, out, jobs=1, progress=False)
    prof.disable()
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    print(
        f"## Build CPU by component ({a.cells:,} cells, {files} sources, --jobs 1, cProfile; load average "
        f"{os.getloadavg()[0]:.1f})\n"
    )
    print(
        f"`python -m benchmarks.experiments.build.build_profile --cells {a.cells}`: build {cpu:.1f} CPU-s ({wall:.1f} s wall under "
        f"the profiler); the codec-bound limit of the same files {limit['cpu_seconds']:.1f} CPU-s "
        f"({cpu / max(limit['cpu_seconds'], 1e-9):.1f}x).\n"
    )
    print("| component | CPU-s | share |\n|---|---:|---:|")
    named = 0.0
    for name, specs in LEAVES.items():
        s = sum(leaf_seconds(stats, spec) for spec in specs)
        named += s
        print(f"| {name} | {s:.2f} | {s / cpu:.0%} |")
    print(
        f"| everything else (numpy in plan and routing, validation, imports, Python) | {cpu - named:.2f} | "
        f"{(cpu - named) / cpu:.0%} |"
    )
    print("\n| stage (cumulative) | CPU-s |\n|---|---:|")
    for name, (file, fn) in STAGES.items():
        print(f"| {name} | {stage_seconds(stats, file, fn):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
