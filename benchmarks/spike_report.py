"""The spike benchmark's report: the methods and on-disk layouts it compares, and the markdown table
`make bench` prints from a run's result (benchmarks/spike_bench.py). Kept apart so the measuring
module holds only what it measures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.spike_config import SpikeBenchConfig

NONE, V1 = "shardsmith, codec = none", "shardsmith, spikebits-v1"
LAYOUTS = (
    ("dat", "raw .dat files (whole streams)"),
    ("voxel_uint8", "uint8 voxel grids of the windows (.npy)"),
    ("voxel_uint8_npz", "uint8 voxel grids, np.savez_compressed"),
    ("voxel_uint8_zstd", "uint8 voxel grids, zstd"),
    ("voxel_float32", "float32 voxel grids (.npy)"),
    ("clip_cache_uint8", "uint8 voxel caches of 5-frame clips (stride 1, .npy)"),
    ("shards", "shardsmith shards, spikebits (the default: pixel-major + zstd)"),
    ("shards_v1", "shardsmith shards, spikebits-v1 (frame-major, transposing codec)"),
    ("shards_lz4", "shardsmith shards, blosc-lz4 (the previous default)"),
    ("shards_none", "shardsmith shards, no codec"),
)


def table(r: dict[str, Any], cfg: SpikeBenchConfig) -> str:
    lo, by, nz = r["loader"], r["bytes"], r["bytes_noisy"]
    ratio = lo["shardsmith"]["over_per_item"]
    lines = [
        f"Spike loader, {r['records']} records of {cfg.height}x{cfg.width}, {cfg.window} of {cfg.file_frames} "
        f"frames kept, {cfg.num_bins} bins, crop {cfg.crop[0]}x{cfg.crop[1]}, batch {cfg.batch_size}, "
        f"num_workers={cfg.num_workers}; median of {cfg.repeats} interleaved {cfg.seconds:g} s windows:",
        "",
        "| method | samples/s |",
        "|---|---:|",
    ]
    lines += [f"| {m} | {x['samples_per_s']:.1f} |" for m, x in lo.items()]
    lines += [
        "",
        f"shardsmith / per-item: **{ratio:.1f}x** with the default spike codec (spikebits, pixel-major), "
        f"**{lo[V1]['over_per_item']:.1f}x** with the previous one (spikebits-v1), "
        f'**{lo[NONE]["over_per_item"]:.1f}x** with `[spike] codec = "dataset"` and `codec = "none"` '
        f"(target >= 10x: {'met' if ratio >= 10 else 'missed'} / "
        f"{'met' if lo[NONE]['over_per_item'] >= 10 else 'missed'})",
    ]
    for w, x in r.get("loader_workers", {}).items():
        lines += [
            "",
            f"num_workers={w} (all three, persistent workers): "
            + ", ".join(f"{m} {v['samples_per_s']:.1f}" for m, v in x.items())
            + " samples/s: "
            f"**{x['shardsmith']['over_per_item']:.1f}x** / {x[V1]['over_per_item']:.1f}x / "
            f"**{x[NONE]['over_per_item']:.1f}x**",
        ]
    jitter, dark = cfg.noise
    lines += [
        "",
        f'Bytes on disk; "noisy": the same scenes with threshold jitter {jitter:g} (relative sd) and '
        f"{dark:g} dark spikes per pixel-frame.",
        "",
        "| on disk | MB | spikebits shards / this | MB, noisy | noisy spikebits shards / this |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, label in LAYOUTS:
        noisy = f"{nz[k] / 1e6:.1f} | {nz['shards'] / nz[k]:.3f}" if k in nz else " | "
        lines.append(f"| {label} | {by[k] / 1e6:.1f} | {by['shards'] / by[k]:.3f} | {noisy} |")
    frac, nfrac = by["shards"] / by["voxel_uint8"], nz["shards"] / nz["voxel_uint8"]
    lines += [
        "",
        f"spikebits shards / uint8 voxel grids (.npy): **{frac:.3f}**, noisy **{nfrac:.3f}** "
        f"(target <= 0.25: {'met' if max(frac, nfrac) <= 0.25 else 'missed'}; 0.25 leaves 10 bits a pixel "
        f'for {cfg.window} frames, and the data\'s entropy is ~20 bits: docs/SPIKE.md, "Codec")',
        "",
    ]
    lines += [
        f"Build (`--jobs {cfg.build_jobs}`, {n}): {x['records_per_s']:.1f} records/s on the build's own timer "
        f"({x['seconds']:.1f} s wall with the interpreter's start), peak RSS of the process tree "
        f"{x['peak_rss_mib']:.0f} MiB."
        for n, x in r["builds"].items()
        if n in ("shards", "shards_none")
    ]
    return "\n".join(lines)
