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
  :func:`benchmarks.ct_data.check_parity` compares the shards with the per-item computation (voxels kept, points
  stored; the
  very same points for a volume under the cap) and fails the bench if they differ.
* the **formats** figure (:mod:`benchmarks.ct_formats_bench`): build time per volume of the same
  ``formats_volumes`` chests of ``loader_shape`` stored as .npy, NIfTI, NRRD and DICOM series;
* the **build** figure builds ``build_volumes`` volumes of ``build_shape`` (default 4 of 512^3, one
shard
  each, so ``--jobs`` tasks run at once) with ``shardsmith build --jobs build_jobs`` in a child
  process:
  volumes/s and the process tree's peak RSS (sampled; it includes the memory-mapped volumes' pages).
* the **crop** figure (:mod:`benchmarks.ct_crop_bench`): ``crop_volumes`` uncapped chests of
  ``loader_shape``'s x, y and ``crop_slices`` slices (~2M points each): the host crop's ms a volume
  before/after the search, and the loader with ``crop=(256, 256, 32), flip=True`` over the loader
  without augmentation, interleaved in this process (target >= 0.5x).

Default run: about 1.5 min on 2 cores (most of it writing the 512^3 volumes on the first run).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ct_crop_bench import CropBenchConfig, run_crop_bench
from benchmarks.ct_data import (
    baseline_item,
    check_parity,
    corpus,
    npz_item,
    write_manifest,
    write_npz_cache,
)
from benchmarks.ct_formats_bench import run_formats_bench
from benchmarks.ct_measure import (
    Chain,
    build,
    interleaved,
    item_batches,
    shard_chain,
    volume_memory,
)
from benchmarks.measure import du


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
    crop_slices: int = 120  # the crop figure's chests: loader_shape's x, y; ~2M points uncapped
    crop_volumes: int = 4


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
            lambda e: item_batches(lambda i: baseline_item(vols[i], max_points=cap), n, bs, e)
        ),
        "npz cache": Chain(lambda e: item_batches(lambda i: npz_item(cache[i]), n, bs, e)),
        "per-item (no mask)": Chain(
            lambda e: item_batches(lambda i: baseline_item(vols[i], False, cap), n, bs, e)
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
    result["formats"] = run_formats_bench(
        data_dir,
        work / "formats",
        cfg.loader_shape,
        cfg.formats_volumes,
        cfg.formats_repeats,
        cfg.max_points,
    )
    crop_cfg = CropBenchConfig(
        shape=(cfg.loader_shape[0], cfg.loader_shape[1], cfg.crop_slices),
        volumes=cfg.crop_volumes,
        batch_size=cfg.batch_size,
        seconds=cfg.seconds,
        repeats=cfg.repeats,
        build_jobs=cfg.build_jobs,
    )
    result["crop"] = run_crop_bench(data_dir, work / "crop", crop_cfg)
    result["table"] = "\n\n".join(
        (table(result, cfg), result["formats"]["table"], result["crop"]["table"])
    )
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
