"""Spike figures for ``make bench``: our loader vs a Spike-Zoo/SpikeCV-style per-item loader, bytes
on disk, build records/s and peak RSS.

    from benchmarks.spike_bench import run_spike_bench
    result = run_spike_bench(data_dir, work_dir)   # -> dict; result["table"] is markdown
    python -m benchmarks.spike_bench --data-dir bench_data --work-dir bench_data/work/spike

Data (generated once, cached under ``data_dir``): ``sequences`` x ``frames_per_sequence``
``.dat`` files of 250 x 400 pixels (Vidar: bit-packed, rows flipped), ``file_frames`` frames
each, in a GoPro-style tree (no images), spikes from an integrate-and-fire model of a drifting
pattern (``pipeline.modalities.spike.demo``), as a spike camera makes them (about 30% of pixels
fire per frame). Each record keeps the central ``window`` frames.

Loader methods, measured in ONE process, interleaved (A, B, A, B; ``repeats`` windows of
``seconds``), median:

* ``per-item``: what Spike-Zoo / SpikeCV dataset classes do in ``__getitem__``: read the whole
``.dat``,
  unpack every frame, flip rows, keep the central window, sum into ``num_bins`` voxel bins
  (float32), random
  crop; a ``torch.utils.data.DataLoader`` (same batch size and ``num_workers``) collates;
* ``shardsmith``: ``ShardDataset(sample="spike", num_bins, crop)`` over the built shards (zarr) with
the
  default spike codec (``[spike] codec = "spikebits"``: the window stored pixel-major + zstd, voxels
  by
  popcount, ``loaders/modalities/spike/ops.py``), over shards of the previous default
  (``"spikebits-v1"``: frame-major
  column, the codec transposes back on every read, ``loaders/modalities/spike/bits.py``), and over
  shards without a codec
  (``[spike] codec = "dataset"`` with ``[dataset] codec = "none"``: frame-major, nothing to decode).

Both give float32 voxels ``[B, num_bins, h, w]`` (ours ``[B, 1, num_bins, h, w]``: clips of one
frame). ``num_workers`` is measured first (``result["loader"]``), then each of ``more_workers``
(both loaders with persistent workers, ``result["loader_workers"]``).

Bytes: the raw ``.dat`` files, uint8 / float32 voxel grids of the same windows as ``.npy`` files
(what voxel caches store), the uint8 grids compressed (``np.savez_compressed``, and zstd: caches
a careful user would write), per-clip caches, and our shards: spikebits (the default), blosc-lz4
(the previous default) and no codec. At 40 frames and 5 bins a bit-packed window has exactly the
bytes of its uint8 voxel grid (40 bits = 5 bytes a pixel): only compression can move that ratio.
Bytes are measured twice: on the corpus as the demo generator makes it, and on a noisier one
(``noise``: threshold jitter and dark spikes, as real sensors have).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ct_measure import build as build_child
from benchmarks.measure import du
from benchmarks.spike_config import SpikeBenchConfig
from benchmarks.spike_report import NONE, V1, table
from pipeline.modalities.spike.demo import integrate_and_fire, scene, vidar_bytes


def corpus(data_dir: Path, cfg: SpikeBenchConfig, noise: tuple[float, float] = (0.0, 0.0)) -> Path:
    tag = f"_j{noise[0]:g}_d{noise[1]:g}" if any(noise) else ""
    root = (
        data_dir
        / f"spike_{cfg.height}x{cfg.width}_{cfg.sequences}x{cfg.frames_per_sequence}_{cfg.file_frames}{tag}"
    )
    done = root / ".complete"
    if done.exists():
        return root
    for s in range(cfg.sequences):
        folder = root / "train" / f"seq{s:03d}" / "spike"
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(
            cfg.frames_per_sequence
        ):  # an integrate-and-fire camera watching a drifting pattern
            t = f * cfg.file_frames + np.arange(cfg.file_frames)
            spikes = integrate_and_fire(
                scene(t, cfg.height, cfg.width, seed=s),
                seed=s * 1000 + f,
                jitter=noise[0],
                dark=noise[1],
            )
            (folder / f"{f:06d}.dat").write_bytes(vidar_bytes(spikes))
    done.write_text("ok")
    return root


def manifest(
    path: Path,
    tree: Path,
    cfg: SpikeBenchConfig,
    codec: str = "blosc-lz4",
    spike_codec: str = "spikebits",
) -> Path:
    path.write_text(f"""[dataset]
name = "bench-spike"
kind = "spike"
format = "zarr"
seed = 0
shard_size_mb = 64
codec = "{codec}"
codec_level = {cfg.zstd_level if codec == "zstd" else 5}

[[sources]]
path = "{tree}"
type = "dat"

[spike]
height = {cfg.height}
width = {cfg.width}
frames = {cfg.window}
num_bins = {cfg.num_bins}
layout = "gopro"
codec = "{spike_codec}"
""")
    return path


class PerItemSpikes:
    """The usual spike dataset class: everything per item, per epoch, in Python/numpy."""

    def __init__(self, files: list[Path], cfg: SpikeBenchConfig, seed: int = 0) -> None:
        self.files, self.cfg, self.rng = files, cfg, np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> np.ndarray:
        c = self.cfg
        vox = voxel_window(self.files[i], c, np.float32)
        y, x = (
            self.rng.integers(0, c.height - c.crop[0] + 1),
            self.rng.integers(0, c.width - c.crop[1] + 1),
        )
        return np.ascontiguousarray(vox[:, y : y + c.crop[0], x : x + c.crop[1]])


def voxel_window(path: Path, c: SpikeBenchConfig, dtype: Any) -> np.ndarray:
    """Read the whole file, unpack every frame, flip rows, keep the central window, sum into bins."""
    raw = np.fromfile(path, np.uint8)
    frames = np.unpackbits(raw.reshape(-1, c.height * c.width // 8), axis=1, bitorder="little")
    frames = frames.reshape(-1, c.height, c.width)[:, ::-1]
    start = (frames.shape[0] - c.window) // 2
    win = frames[start : start + c.window].astype(dtype)
    return win.reshape(c.num_bins, -1, c.height, c.width).sum(1, dtype=dtype)


def voxel_cache_bytes(files: list[Path], c: SpikeBenchConfig) -> dict[str, int]:
    """Bytes of the voxel caches users keep of every window: one uint8 / float32 ``.npy`` per window
    (header included), uint8 ``np.savez_compressed`` (zlib), and uint8 zstd."""
    import io

    from numcodecs import Zstd

    codec, out = (
        Zstd(level=c.zstd_level),
        {"voxel_uint8": 0, "voxel_float32": 0, "voxel_uint8_npz": 0, "voxel_uint8_zstd": 0},
    )
    for f in files:
        vox = voxel_window(f, c, np.uint8)
        for key, a in (("voxel_uint8", vox), ("voxel_float32", vox.astype(np.float32))):
            buf = io.BytesIO()
            np.save(buf, a)
            out[key] += buf.tell()
        buf = io.BytesIO()
        np.savez_compressed(buf, voxel=vox)
        out["voxel_uint8_npz"] += buf.tell()
        out["voxel_uint8_zstd"] += len(codec.encode(vox))
    out["clip_cache_uint8"] = out["voxel_uint8"] * c.clip_cache
    return out


class Chain:
    """Endless batches over epochs; ``next()`` returns the batch's sample count."""

    def __init__(self, make: Callable[[int], Iterator[Any]]) -> None:
        self.make, self.epoch = make, 0
        self.it = make(0)

    def next(self) -> int:
        while True:
            try:
                b = next(self.it)
            except StopIteration:
                self.epoch += 1
                self.it = self.make(self.epoch)
                continue
            v = b["voxel"] if isinstance(b, dict) else b
            return int(v.shape[0])


def interleaved(
    methods: dict[str, Chain], seconds: float, repeats: int
) -> dict[str, dict[str, Any]]:
    for c in methods.values():
        c.next()
    runs: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(repeats):
        for m, c in methods.items():
            n, t0 = 0, time.perf_counter()
            while (dt := time.perf_counter() - t0) < seconds:
                n += c.next()
            runs[m].append(n / dt)
    return {m: {"samples_per_s": statistics.median(r), "windows": r} for m, r in runs.items()}


def run_spike_bench(
    data_dir: str | Path, work_dir: str | Path, cfg: SpikeBenchConfig | None = None
) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    from loaders import ShardDataset, ShardLoader

    cfg = cfg or SpikeBenchConfig()

    data_dir, work = (
        Path(data_dir).resolve(),
        Path(work_dir).resolve(),
    )  # the manifest and the child need absolute paths
    work.mkdir(parents=True, exist_ok=True)
    tree, noisy = corpus(data_dir, cfg), corpus(data_dir, cfg, cfg.noise)
    files, noisy_files = sorted(tree.rglob("*.dat")), sorted(noisy.rglob("*.dat"))
    result: dict[str, Any] = {"config": asdict(cfg), "records": len(files)}
    builds = {
        "shards": ("blosc-lz4", "spikebits", tree),
        "shards_v1": ("blosc-lz4", "spikebits-v1", tree),
        "shards_lz4": ("blosc-lz4", "dataset", tree),
        "shards_none": ("none", "dataset", tree),
        "shards_noisy": ("blosc-lz4", "spikebits", noisy),
    }
    result["builds"] = {}
    for name, (codec, spike_codec, src) in builds.items():
        b = build_child(
            manifest(work / f"{name}.toml", src, cfg, codec, spike_codec),
            work / name,
            cfg.build_jobs,
        )
        result["builds"][name] = {**b, "records_per_s": len(files) / b["build_seconds"]}
    result["build"] = result["builds"]["shards"]

    def measure(workers: int) -> dict[str, Any]:
        persistent = workers > 0

        def ours(root: Path) -> Chain:
            ds = ShardDataset(
                root,
                split="train",
                sample="spike",
                batch_size=cfg.batch_size,
                num_bins=cfg.num_bins,
                crop=cfg.crop,
                seed=0,
            )
            loader = ShardLoader(ds, num_workers=workers, persistent_workers=persistent)

            def epoch(e: int) -> Iterator[Any]:
                loader.set_epoch(e)
                return iter(loader)

            return Chain(epoch)

        base = DataLoader(
            PerItemSpikes(files, cfg),
            batch_size=cfg.batch_size,
            shuffle=True,
            num_workers=workers,
            persistent_workers=persistent,
            generator=torch.Generator().manual_seed(0),
        )
        lo = interleaved(
            {
                "shardsmith": ours(work / "shards"),
                V1: ours(work / "shards_v1"),
                NONE: ours(work / "shards_none"),
                "per-item": Chain(lambda e: iter(base)),
            },
            cfg.seconds,
            cfg.repeats,
        )
        for m in ("shardsmith", V1, NONE):
            lo[m]["over_per_item"] = lo[m]["samples_per_s"] / lo["per-item"]["samples_per_s"]
        return lo

    result["loader"] = measure(cfg.num_workers)
    result["loader_workers"] = {w: measure(w) for w in cfg.more_workers if w != cfg.num_workers}
    result["bytes"] = {
        "dat": du(files),
        **voxel_cache_bytes(files, cfg),
        **{k: du(work / k) for k in ("shards", "shards_v1", "shards_lz4", "shards_none")},
    }
    result["bytes_noisy"] = {
        "dat": du(noisy_files),
        **voxel_cache_bytes(noisy_files, cfg),
        "shards": du(work / "shards_noisy"),
    }
    result["table"] = table(result, cfg)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="bench_data")
    ap.add_argument("--work-dir", default="bench_data/work/spike")
    ap.add_argument("--seconds", type=float, default=SpikeBenchConfig.seconds)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    r = run_spike_bench(a.data_dir, a.work_dir, SpikeBenchConfig(seconds=a.seconds))
    print(r["table"])
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
