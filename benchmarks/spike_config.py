"""The spike benchmark's settings: their own module, so that the measuring module (spike_bench.py) and
the report (spike_report.py) both use them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpikeBenchConfig:
    height: int = 250
    width: int = 400
    sequences: int = 20
    frames_per_sequence: int = 10  # records = sequences x frames_per_sequence (>= 200)
    file_frames: int = 64  # frames in each .dat (the per-item baseline reads them all)
    window: int = 40
    num_bins: int = 5
    crop: tuple[int, int] = (128, 128)
    batch_size: int = 8
    num_workers: int = 0
    seconds: float = 2.0
    repeats: int = 3
    build_jobs: int = 2
    # a per-clip voxel cache of clips of this many frames (stride 1) stores each frame this often
    clip_cache: int = 5
    more_workers: tuple[int, ...] = (2,)  # also measured with these num_workers (both loaders)
    zstd_level: int = 5
    noise: tuple[float, float] = (
        0.03,
        1e-3,
    )  # the noisy corpus: threshold jitter (relative sd), dark spikes/px/frame
