"""CT figures for ``make bench``: our loader vs the per-item baseline and an npz cache, bytes, 512^3
builds.

    from benchmarks.ct_bench import run_ct_bench
    result = run_ct_bench(data_dir, work_dir)      # -> dict; result["table"] is a markdown table
    python -m benchmarks.ct_bench --data-dir bench_data --work-dir bench_data/work/ct

Two corpora, both synthetic chest CTs (pipeline.modalities.ct.demo, cached by parameters under
``data_dir``):

* the **loader** figure uses ``loader_volumes`` volumes of ``loader_shape`` (default 8 of 512 x 512
x 48,
  the size of the real scans the issue measured). Methods, measured in ONE process, interleaved
  (A, B, C, A, B, C, ...; ``repeats`` windows of ``seconds`` each) and reported as the median
  window:
  - ``per-item``: what CT dataset classes do in ``__getitem__``: memory-map the ``.npy``, window +
  band,
    body mask (threshold, largest component, per-slice hole fill), ``np.nonzero``, collate the
    batch;
  - ``per-item (no mask)``: the same without the body mask (cheaper, but keeps the air around the
  body: not
    the same output; shown as a lower bound of what a per-item class costs);
  - ``npz cache``: one ``np.savez_compressed`` of (coords, hu, window) per volume, loaded per item
  and
    collated (the usual "preprocess once" cache);
  - ``shardsmith``: ``ShardDataset(sample="ct")`` over the built shards (zarr), the same batch size.
  All four produce the same coords/feats layout (int32 [N,4], float32 [N,C], offsets). Before
  timing,
  :func:`check_parity` compares the shards with the per-item computation (voxels kept, points
  stored; the
  very same points for a volume under the cap) and fails the bench if they differ.
* the **formats** figure (:mod:`benchmarks.ct_formats_bench`): build time per volume of the same
  ``formats_volumes`` chests of ``loader_shape`` stored as .npy, NIfTI, NRRD and DICOM series;
* the **build** figure builds ``build_volumes`` volumes of ``build_shape`` (default 4 of 512^3, one
shard
  each, so ``--jobs`` tasks run at once) with ``shardsmith build --jobs build_jobs`` in a child
  process:
  volumes/s and the process tree's peak RSS (sampled; it includes the memory-mapped volumes' pages).

Default run: about 1.5 min on 2 cores (most of it writing the 512^3 volumes on the first run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import ndimage

from loaders.modalities.ct.ops import collate
from pipeline.modalities.ct.demo import write_large_chest

REPO = Path(__file__).resolve().parents[1]
LEVEL, WIDTH, BAND, THRESHOLD = -600.0, 1500.0, (-1000.0, -400.0), -500.0


@dataclass(frozen=True)
class CtBenchConfig:
    loader_shape: tuple[int, int, int] = (512, 512, 48)
    loader_volumes: int = 8
    batch_size: int = 2
    seconds: float = 2.0  # per measured window
    repeats: int = 3
    build_shape: tuple[int, int, int] = (512, 512, 512)
    build_volumes: int = 4
    build_jobs: int = 2
    max_points: int = 500_000
    seed: int = 0
    formats_volumes: int = 2  # build time per volume by source format, on loader_shape chests
    formats_repeats: int = 2


# -- the baselines
# -------------------------------------------------------------------------------------------
def baseline_item(
    path: Path, body_mask: bool = True, max_points: int | None = None
) -> dict[str, np.ndarray]:
    """One volume the way a per-item CT dataset computes it (the same rule as a shardsmith record,
    and the
    same cap: a sorted random subset of ``max_points``)."""
    hu = np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))
    lo, hi = LEVEL - WIDTH / 2, LEVEL + WIDTH / 2
    keep = (hu >= max(lo, BAND[0])) & (hu <= min(hi, BAND[1]))
    if body_mask:
        m = hu > THRESHOLD
        lab, n = ndimage.label(m)
        if n:
            m = lab == (np.argmax(np.bincount(lab.ravel())[1:]) + 1)
        for k in range(m.shape[-1]):
            m[..., k] = ndimage.binary_fill_holes(m[..., k])
        keep &= m
    idx = np.nonzero(keep)
    kept = idx[0].size
    if max_points is not None and idx[0].size > max_points:
        sel = np.sort(np.random.default_rng(0).choice(idx[0].size, max_points, replace=False))
        idx = tuple(i[sel] for i in idx)
    vals = hu[idx]
    return {
        "coords": np.stack(idx, axis=1).astype(np.uint16),
        "hu": vals,
        "window": np.clip((vals - np.float32(lo)) / np.float32(WIDTH), 0, 1).astype(np.float16),
        "kept": np.asarray(kept, dtype=np.int64),
    }


def _batches(
    items: Callable[[int], dict[str, np.ndarray]], n: int, batch_size: int, epoch: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
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


def write_npz_cache(volumes: list[Path], out: Path, max_points: int) -> list[Path]:
    """The usual preprocessing cache: one compressed npz of the sparse result per volume."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for v in volumes:
        item = baseline_item(v, max_points=max_points)  # the same cap as the shards
        p = out / f"{v.stem}.npz"
        np.savez_compressed(p, **item)
        paths.append(p)
    return paths


def check_parity(cache: list[Path], shards: Path) -> dict[str, int]:
    """The methods must deliver the same data, or the speed ratio means nothing: per volume, the npz
    cache
    (the per-item computation, saved) and the shards agree on the voxels kept before the cap and the
    points
    stored; an uncapped volume's coordinates and features are equal. RuntimeError naming the volume
    if not."""
    from loaders.dataset import ShardDataset
    from loaders.format import read_index

    index = read_index(shards)
    recs = {r["file"]: r for rs in index.section("ct")["records"].values() for r in rs}
    got = {}
    for b in ShardDataset(
        shards, split="train", sample="ct", batch_size=1, shuffle=False, decode_process=False
    ):
        got[Path(index.sources[int(b["sample_id"][0])]["path"]).name] = (
            b["coords"][:, 1:].numpy(),
            b["feats"].numpy(),
        )
    exact = 0
    for p in cache:
        name, z = f"{p.stem}.npy", npz_item(p, with_kept=True)
        r = recs.get(name)
        if r is None or name not in got:
            raise RuntimeError(f"parity: {name} is in the npz cache but not in the shards")
        if (
            int(z["kept"]) != int(r["kept"])
            or z["coords"].shape[0] != int(r["points"])
            or got[name][0].shape[0] != int(r["points"])
        ):
            raise RuntimeError(
                f"parity: {name}: per-item keeps {int(z['kept'])} voxels, stores {len(z['coords'])}; "
                f"shards {r['kept']}, {r['points']}"
            )
        if int(r["kept"]) == int(r["points"]):  # no cap drawn: the very same points
            feats = np.stack([z["hu"].astype(np.float32), z["window"].astype(np.float32)], axis=1)
            if not (
                np.array_equal(got[name][0], z["coords"]) and np.array_equal(got[name][1], feats)
            ):
                raise RuntimeError(f"parity: {name}: shards and per-item give different points")
            exact += 1
    return {"volumes": len(cache), "compared_exactly": exact}


def npz_item(path: Path, with_kept: bool = False) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in ("coords", "hu", "window", *(("kept",) if with_kept else ()))}


# -- measurement
# ---------------------------------------------------------------------------------------------
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


def du(paths: list[Path] | Path) -> int:
    paths = [paths] if isinstance(paths, Path) else paths
    total = 0
    for p in paths:
        total += (
            p.stat().st_size
            if p.is_file()
            else sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        )
    return total


# -- data and builds
# -----------------------------------------------------------------------------------------
def corpus(data_dir: Path, shape: tuple[int, int, int], n: int) -> list[Path]:
    d = data_dir / f"ct_{'x'.join(map(str, shape))}_{n}"
    paths = [d / f"chest_{i:03d}.npy" for i in range(n)]
    for i, p in enumerate(paths):
        if not p.exists():
            write_large_chest(p, shape, 100 + i)
    return paths


def write_manifest(
    path: Path,
    volumes_glob: str,
    name: str,
    fmt: str,
    max_points: int,
    seed: int,
    shard_size_mb: float = 64,
) -> Path:
    path.write_text(f"""[dataset]
name = "{name}"
kind = "ct"
format = "{fmt}"
seed = {seed}
shard_size_mb = {shard_size_mb}

[[sources]]
path = "{volumes_glob}"
type = "npy"

[ct]
max_points = {max_points}

[split]
val_fraction = 0.0
test_fraction = 0.0
""")
    return path


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
    working set)
    and the VmHWM growth (which also counts the memory-mapped file's pages), as multiples of its
    int16 bytes."""
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


def shard_chain(root: Path, batch_size: int) -> Chain:
    from loaders.dataset import ShardDataset

    ds = ShardDataset(root, split="train", sample="ct", batch_size=batch_size, shuffle=True, seed=0)

    def make(
        epoch: int,
    ) -> Iterator[Any]:  # one dataset for the run, as a trainer keeps it: epochs re-plan
        ds.set_epoch(epoch)
        return iter(ds)

    return Chain(make)


def run_ct_bench(
    data_dir: str | Path, work_dir: str | Path, cfg: CtBenchConfig = CtBenchConfig()
) -> dict[str, Any]:
    data_dir, work = (
        Path(data_dir).resolve(),
        Path(work_dir).resolve(),
    )  # manifests resolve paths from their folder
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"config": asdict(cfg)}
    vols = corpus(data_dir, cfg.loader_shape, cfg.loader_volumes)
    m = write_manifest(
        work / "ct_loader.toml",
        str(vols[0].parent / "*.npy"),
        "bench-ct",
        "zarr",
        cfg.max_points,
        cfg.seed,
    )
    result["loader_build"] = build(m, work / "shards_loader", cfg.build_jobs)
    t0 = time.perf_counter()
    cache = write_npz_cache(vols, work / "npz_cache", cfg.max_points)
    result["npz_cache_build_s"] = time.perf_counter() - t0
    result["parity"] = check_parity(cache, work / "shards_loader")
    bs, n, cap = cfg.batch_size, len(vols), cfg.max_points
    methods = {
        "shardsmith": shard_chain(work / "shards_loader", bs),
        "per-item": Chain(
            lambda e: _batches(lambda i: baseline_item(vols[i], max_points=cap), n, bs, e)
        ),
        "npz cache": Chain(lambda e: _batches(lambda i: npz_item(cache[i]), n, bs, e)),
        "per-item (no mask)": Chain(
            lambda e: _batches(lambda i: baseline_item(vols[i], False, cap), n, bs, e)
        ),
    }
    loader = interleaved(methods, cfg.seconds, cfg.repeats)
    ours = loader["shardsmith"]["volumes_per_s"]
    for r in loader.values():
        r["ours_over_this"] = ours / r["volumes_per_s"] if r["volumes_per_s"] else float("inf")
    result["loader"] = loader
    result["bytes"] = {
        "npy": du(vols),
        "npz_cache": du(cache),
        "shards": du(work / "shards_loader"),
    }
    big = corpus(data_dir, cfg.build_shape, cfg.build_volumes)
    mb = write_manifest(
        work / "ct_build.toml",
        str(big[0].parent / "*.npy"),
        "bench-ct-512",
        "zarr",
        cfg.max_points,
        cfg.seed,
        shard_size_mb=4,
    )  # ~1 volume a shard: one pack task each
    b = build(mb, work / "shards_build", cfg.build_jobs)
    b["volumes_per_s"] = cfg.build_volumes / b["build_seconds"]
    b["volumes_per_s_with_start"] = cfg.build_volumes / b["seconds"]
    b["volume_mib"] = int(np.prod(cfg.build_shape)) * 2 / 2**20
    result["build_512"] = b
    result["volume_memory"] = volume_memory(big[0], cfg.max_points)
    from benchmarks.ct_formats_bench import run_formats_bench

    result["formats"] = run_formats_bench(
        data_dir,
        work / "formats",
        cfg.loader_shape,
        cfg.formats_volumes,
        cfg.formats_repeats,
        cfg.max_points,
    )
    result["table"] = table(result, cfg) + "\n\n" + result["formats"]["table"]
    return result


def table(r: dict[str, Any], cfg: CtBenchConfig) -> str:
    shape = "x".join(map(str, cfg.loader_shape))
    lines = [
        f"CT loader, {cfg.loader_volumes} volumes of {shape}, batch {cfg.batch_size}, median of "
        f"{cfg.repeats} interleaved {cfg.seconds:g} s windows:",
        "",
        "| method | volumes/s | Mpoints/s | shardsmith / method |",
        "|---|---:|---:|---:|",
    ]
    for name, x in r["loader"].items():
        lines.append(
            f"| {name} | {x['volumes_per_s']:.2f} | {x['points_per_s'] / 1e6:.2f} | "
            f"{x['ours_over_this']:.1f}x |"
        )
    by = r["bytes"]
    lines += ["", "| on disk | MB | vs .npy |", "|---|---:|---:|"]
    for k in ("npy", "npz_cache", "shards"):
        lines.append(f"| {k} | {by[k] / 1e6:.1f} | {by[k] / by['npy']:.4f} |")
    b = r["build_512"]
    lines += [
        "",
        f"Build of {cfg.build_volumes} x {'x'.join(map(str, cfg.build_shape))} int16 volumes "
        f"({b['volume_mib']:.0f} MiB each), --jobs {cfg.build_jobs}: {b['volumes_per_s']:.2f} volumes/s "
        f"({b['volumes_per_s_with_start']:.2f} counting the interpreter's start), peak RSS of the build's "
        f"process tree {b['peak_rss_mib']:.0f} MiB.",
        "",
        f"One such volume in one process: {r['volume_memory']['seconds']:.1f} s, numpy working set "
        f"(tracemalloc peak) {r['volume_memory']['traced_peak_x']:.2f} x its int16 bytes, RSS growth "
        f"{r['volume_memory']['rss_growth_x']:.2f} x (includes the memory-mapped file's pages).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="bench_data")
    ap.add_argument("--work-dir", default="bench_data/work/ct")
    ap.add_argument("--seconds", type=float, default=CtBenchConfig.seconds)
    ap.add_argument("--repeats", type=int, default=CtBenchConfig.repeats)
    ap.add_argument("--json", default="", help="also write the result dict here")
    a = ap.parse_args(argv)
    cfg = CtBenchConfig(seconds=a.seconds, repeats=a.repeats)
    r = run_ct_bench(a.data_dir, a.work_dir, cfg)
    print(r["table"])
    if a.json:
        Path(a.json).write_text(json.dumps({k: v for k, v in r.items()}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
