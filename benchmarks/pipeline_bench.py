"""Pipeline figures: build throughput against the codec-bound limit, peak RSS against size, --jobs
scaling, incremental and no-change rebuilds. Builds run the real CLI in a child process (``python
-m pipeline build``) whose whole process tree (joblib workers included) is RSS-sampled from here.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.measure import MB, MIB, RssSampler
from loaders.format.digests import file_digest

REPO = Path(__file__).resolve().parents[1]
BUILT_RE = re.compile(r"built .*?: (\d+) shards written, (\d+) reused in ([\d.]+)s")


@dataclass
class BuildRun:
    label: str
    n_cells: int
    jobs: int
    codec: str
    source_bytes: int  # CSR bytes of the sources (data + indices + indptr)
    wall_s: float  # whole CLI process, interpreter start included
    internal_s: float  # the build's own total, as printed by the CLI (-1 if not printed)
    peak_rss_mb: float  # main process + joblib workers
    rc: int
    written: int = -1
    reused: int = -1
    shards: int = 0
    stored_bytes: int = 0
    raw_bytes: int = 0
    error: str = ""
    cpu_s: float = (
        -1.0
    )  # user + system CPU seconds of the CLI process and the children it waited for

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def cells_per_s(self) -> float:
        return self.n_cells / self.wall_s if self.ok and self.wall_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.source_bytes / MB / self.wall_s if self.ok and self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "cells_per_s": self.cells_per_s,
            "mb_per_s": self.mb_per_s,
            "cells_per_s_per_job": self.cells_per_s / max(1, self.jobs),
        }


def pipeline_available() -> str:
    """'' if `python -m pipeline build` exists, else why not."""
    if not (REPO / "pipeline" / "cli.py").exists():
        return "pipeline/cli.py not found"
    return ""


def run_build(
    label: str,
    manifest: Path,
    out: Path,
    jobs: int,
    *,
    n_cells: int,
    codec: str,
    source_bytes: int,
    log_dir: Path,
    extra: tuple[str, ...] = (),
) -> BuildRun:
    """Run one build, timing it and sampling the RSS of its process tree (`extra`: more CLI
    arguments)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"build-{label}.log"
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
        *extra,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    with open(log, "w") as fh:
        t0 = time.perf_counter()
        cpu0 = _children_cpu()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
        sampler = RssSampler(proc.pid)
        with sampler:
            rc = proc.wait()
        wall = time.perf_counter() - t0
        cpu = _children_cpu() - cpu0
    text = log.read_text(errors="replace")
    m = BUILT_RE.search(text)
    run = BuildRun(
        label,
        n_cells,
        jobs,
        codec,
        source_bytes,
        wall,
        float(m.group(3)) if m else -1.0,
        sampler.peak / MIB,
        rc,
    )
    run.cpu_s = cpu
    if m:
        run.written, run.reused = int(m.group(1)), int(m.group(2))
    if rc != 0:
        run.error = text.strip().splitlines()[-1][:300] if text.strip() else f"exit code {rc}"
    idx = out / "index.json"
    if rc == 0 and idx.exists():
        doc = json.loads(idx.read_text())
        run.shards = len(doc.get("shards", []))
        run.stored_bytes = sum(int(s.get("bytes", 0)) for s in doc.get("shards", []))
        run.raw_bytes = sum(int(s.get("raw_bytes", 0)) for s in doc.get("shards", []))
    print(
        f"[build] {label}: {'ok' if rc == 0 else 'FAILED'} {wall:.1f}s, peak RSS {run.peak_rss_mb:.0f} MiB "
        f"({n_cells} cells, --jobs {jobs}, {codec}){' ' + run.error if run.error else ''}",
        flush=True,
    )
    return run


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def blosc_codec(codec: str, level: int = 5) -> Any:
    import numcodecs

    if codec.startswith("blosc-"):
        return numcodecs.Blosc(
            cname=codec.split("-", 1)[1], clevel=level, shuffle=numcodecs.Blosc.SHUFFLE
        )
    if codec == "zstd":
        return numcodecs.Zstd(level=level)
    return None


def codec_bound_limit(
    files: list[Path],
    codec: str,
    level: int = 5,
    block_bytes: int = 8 << 20,
    repeats: int = 3,
    reuse: bool = False,
) -> dict[str, Any]:
    """Read the source CSR with h5py in large contiguous blocks and compress the same bytes; nothing
    else.

    Single-threaded (blosc nthreads = 1, as the pipeline sets per task): the limit of one job.
    Each block is a fresh array compressed into fresh bytes; with ``reuse`` (`codec_floor`) it is
    read into one buffer per dtype (``read_direct``) and compressed into one destination per item
    size (the build's own `BloscInto`).
    """
    import h5py
    import numcodecs.blosc

    from pipeline.buffers import release_thread_buffers  # the encoders' destinations live there
    from pipeline.writers.blosc_into import blosc_into  # the pack's encoder (a reused buffer)

    numcodecs.blosc.set_nthreads(1)
    comp = blosc_codec(codec, level)
    cname = codec.split("-", 1)[1] if reuse and codec.startswith("blosc-") else ""
    buffers: dict[str, np.ndarray] = {}  # dtype -> the block buffer (reuse)
    encoders: dict[int, Any] = {}  # item size -> one encoder for every file (reuse)
    times, read_times, cpu_times, raw, stored, cells = [], [], [], 0, 0, 0
    for _ in range(repeats):
        raw = stored = cells = 0
        t_read = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        for path in files:
            with h5py.File(path, "r") as f:
                g = f["X"]
                cells += int(g.attrs["shape"][0])
                for key in ("indptr", "indices", "data"):
                    ds = g[key]
                    step = max(1, block_bytes // ds.dtype.itemsize)
                    size = ds.dtype.itemsize
                    if reuse:
                        buf = buffers.setdefault(ds.dtype.str, np.empty(step, ds.dtype))
                        if cname and size not in encoders:
                            encoders[size] = blosc_into(
                                cname, level, numcodecs.blosc.SHUFFLE, 0, size
                            )
                    into = encoders.get(size)  # None: numcodecs' own encode
                    encode = into.encode if into is not None else comp.encode if comp else None
                    for s in range(0, ds.shape[0], step):
                        tr = time.perf_counter()
                        if reuse:
                            n = min(step, ds.shape[0] - s)
                            ds.read_direct(buf, np.s_[s : s + n], np.s_[0:n])
                            a = buf[:n]
                        else:
                            a = ds[s : s + step]
                        t_read += time.perf_counter() - tr
                        raw += a.nbytes
                        stored += len(encode(a)) if encode is not None else a.nbytes
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        read_times.append(t_read)
    if reuse:
        release_thread_buffers()
    t = statistics.median(times)
    return {
        "codec": codec,
        "level": level,
        "seconds": t,
        "read_seconds": statistics.median(read_times),
        "cpu_seconds": statistics.median(cpu_times),
        "cells": cells,
        "raw_bytes": raw,
        "compressed_bytes": stored,
        "ratio": raw / max(1, stored),
        "cells_per_s": cells / t,
        "mb_per_s": raw / MB / t,
        "repeats": times,
        "block_bytes": block_bytes,
        "threads": 1,
        "reuse": reuse,
    }


def codec_floor(
    files: list[Path], codec: str, level: int = 5, block_bytes: int = 8 << 20
) -> dict[str, Any]:
    """`codec_bound_limit`'s work with its memory reused, once. Why: the limit reads into fresh
    arrays and compresses into fresh bytes, and on a VM that hands free memory back to its host
    their pages cost more or less from one run to the next (over the 2M screen 3.4-4.8 CPU-s from
    run to run, this 3.2-3.5: docs/benchmarks/ANALYSIS.md, 26.3b). The steadier floor of that work;
    scale_bench reports the build against it beside the limit."""
    return codec_bound_limit(files, codec, level, block_bytes, repeats=1, reuse=True)


def digest_seconds(files: list[Path]) -> float:
    """Seconds to digest every source as a build's fingerprint does (xxh3-128, loaders.format.digests)."""
    t0 = time.perf_counter()
    for p in files:
        file_digest(p)
    return time.perf_counter() - t0


def shard_hashes(out: Path) -> dict[str, str]:
    doc = json.loads((out / "index.json").read_text())
    return {s["plan_key"]: s.get("digest") or s["sha256"] for s in doc.get("shards", [])}


def incremental(
    files: list[Path],
    manifest: Path,
    out: Path,
    jobs: int,
    *,
    n_cells: int,
    codec: str,
    source_bytes: int,
    log_dir: Path,
    changed: int = 3,
) -> dict[str, Any]:
    """Full build of a k-file dataset, then rebuild after rewriting one file, then rebuild with no
    change."""
    from benchmarks.synth import rewrite_changed_values

    full = run_build(
        "incr-full",
        manifest,
        out,
        jobs,
        n_cells=n_cells,
        codec=codec,
        source_bytes=source_bytes,
        log_dir=log_dir,
    )
    res: dict[str, Any] = {
        "files": len(files),
        "changed_file": files[changed].name,
        "full": full.to_json(),
    }
    if not full.ok:
        return res
    before = shard_hashes(out)
    res["rewrite_s"] = rewrite_changed_values(files[changed])
    dry = run_build(
        "incr-dry-run",
        manifest,
        out,
        jobs,
        n_cells=n_cells,
        codec=codec,
        source_bytes=source_bytes,
        log_dir=log_dir,
        extra=("--dry-run",),
    )
    res["dry_run"] = {**dry.to_json(), "unchanged": shard_hashes(out) == before}
    one = run_build(
        "incr-1-of-k",
        manifest,
        out,
        jobs,
        n_cells=n_cells,
        codec=codec,
        source_bytes=source_bytes,
        log_dir=log_dir,
    )
    after = shard_hashes(out) if one.ok else {}
    res["changed"] = one.to_json()
    res["shards_total"] = len(after)
    res["shards_rehashed_different"] = sum(1 for k, v in after.items() if before.get(k) != v)
    noop = run_build(
        "incr-nochange",
        manifest,
        out,
        jobs,
        n_cells=n_cells,
        codec=codec,
        source_bytes=source_bytes,
        log_dir=log_dir,
    )
    res["nochange"] = noop.to_json()
    res["hash_s"] = digest_seconds(files)
    res["ratio_changed_vs_full"] = one.wall_s / full.wall_s if one.ok else None
    return res


def rss_flatness(runs: list[BuildRun]) -> dict[str, Any]:
    ok = [r for r in runs if r.ok]
    if len(ok) < 2:
        return {"max_over_min": None, "max_mb": max((r.peak_rss_mb for r in ok), default=0.0)}
    peaks = np.array([r.peak_rss_mb for r in ok])
    return {
        "max_over_min": float(peaks.max() / peaks.min()),
        "max_mb": float(peaks.max()),
        "min_mb": float(peaks.min()),
        "slope_mb_per_100k_cells": float(np.polyfit([r.n_cells / 1e5 for r in ok], peaks, 1)[0]),
    }
