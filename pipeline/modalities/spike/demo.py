"""A small GoPro-style spike corpus, written exactly like real Vidar ``.dat`` files (rows flipped,
LSB first), for ``shardsmith demo`` and the tests.

The scene is a textured pattern moving across the frame; spikes come from an integrate-and-fire
model of it (each pixel accumulates intensity and fires, then resets by one threshold), as a
spike camera does. Sharp images are the scene at the window's centre, blur images its mean over
the exposure (the GoPro-spike setup), both at twice the spike resolution so the loader's scaled
crop is exercised.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HEIGHT, WIDTH, FRAMES = 64, 96, 40
SCALE = 2  # images are SCALE x the spike resolution


def scene(t: np.ndarray, height: int, width: int, seed: int, scale: int = 1) -> np.ndarray:
    """Intensity in [0, 1], ``[len(t), height*scale, width*scale]``, of a pattern drifting with time
    ``t``."""
    rng = np.random.default_rng(seed)
    fy, fx, vx, vy = (
        rng.uniform(0.05, 0.2),
        rng.uniform(0.05, 0.2),
        rng.uniform(0.3, 1.0),
        rng.uniform(-0.5, 0.5),
    )
    y = np.arange(height * scale)[:, None] / scale
    x = np.arange(width * scale)[None, :] / scale
    tt = np.asarray(t, np.float64)[:, None, None]
    a = np.sin(fx * (x - vx * tt)) * np.cos(fy * (y - vy * tt))
    return (0.5 + 0.45 * a).astype(np.float32)


def integrate_and_fire(
    intensity: np.ndarray,
    threshold: float = 1.0,
    gain: float = 0.6,
    seed: int = 0,
    jitter: float = 0.0,
    dark: float = 0.0,
) -> np.ndarray:
    """0/1 spikes ``[T, H, W]``: each pixel integrates ``gain * intensity`` and fires on crossing
    the threshold.

    Real sensors add noise (both off by default, so the demo's bits stay as they were):
    ``jitter``, the relative standard deviation of each pixel's threshold, drawn anew after every
    spike (comparator and reset noise), and ``dark``, the probability per pixel and frame of a
    spurious spike (dark current, hot pixels)."""
    rng = np.random.default_rng(seed)
    acc = rng.uniform(0, threshold, intensity.shape[1:]).astype(np.float32)
    thr = np.full(intensity.shape[1:], threshold, np.float32)
    if jitter:
        thr *= (1 + jitter * rng.standard_normal(thr.shape)).astype(np.float32)
    out = np.zeros(intensity.shape, np.uint8)
    for i in range(intensity.shape[0]):  # the camera's own clock: one step per frame
        acc += gain * intensity[i]
        fired = acc >= thr
        out[i] = fired
        acc[fired] -= thr[fired]
        if jitter:
            thr[fired] = threshold * (1 + jitter * rng.standard_normal(int(fired.sum()))).astype(
                np.float32
            )
    if dark:
        out |= rng.random(out.shape) < dark
    return out


def vidar_bytes(spikes: np.ndarray) -> bytes:
    """What a Vidar camera writes: per frame, rows flipped, H*W bits LSB first, frames concatenated."""
    flipped = spikes[:, ::-1].reshape(spikes.shape[0], -1)
    return np.packbits(flipped, axis=1, bitorder="little").tobytes()


def _png(path: Path, rgb: np.ndarray) -> None:
    import PIL.Image  # optional extra images

    path.parent.mkdir(parents=True, exist_ok=True)
    PIL.Image.fromarray(rgb).save(path, format="PNG")


def _color(intensity: np.ndarray, seed: int) -> np.ndarray:
    tint = np.random.default_rng(seed + 99).uniform(0.5, 1.0, 3)
    return (np.clip(intensity[..., None] * tint, 0, 1) * 255).round().astype(np.uint8)


def write_sequence(folder: Path, seed: int, n_frames: int, images: bool = True) -> list[Path]:
    """``folder/spike/<i>.dat`` (+ ``blur``/``sharp`` PNGs) for ``n_frames`` consecutive frames."""
    paths = []
    for i in range(n_frames):
        t = i * FRAMES + np.arange(FRAMES)
        spikes = integrate_and_fire(scene(t, HEIGHT, WIDTH, seed), seed=seed * 1000 + i)
        dat = folder / "spike" / f"{i:06d}.dat"
        dat.parent.mkdir(parents=True, exist_ok=True)
        dat.write_bytes(vidar_bytes(spikes))
        paths.append(dat)
        if images:
            hi = scene(t, HEIGHT, WIDTH, seed, SCALE)
            _png(folder / "sharp" / f"{i:06d}.png", _color(hi[FRAMES // 2], seed))
            _png(folder / "blur" / f"{i:06d}.png", _color(hi.mean(axis=0), seed))
    return paths


def write_spike_demo(root: str | Path) -> list[Path]:
    """``root/spike``: a GoPro-style tree (train: 3 sequences, test: 2, 6 frames each, with
    blur/sharp PNGs), and ``root/spike_files``: a plain folder of ``.dat`` files (what
    data_manifests/demo_spike*.toml read)."""
    root = Path(root)
    paths: list[Path] = []
    for split, seeds in (("train", (1, 2, 3)), ("test", (4, 5))):
        for s in seeds:
            paths += write_sequence(root / "spike" / split / f"seq{s:02d}", s, 6)
    files = root / "spike_files"
    files.mkdir(parents=True, exist_ok=True)
    for k in range(8):
        spikes = integrate_and_fire(scene(np.arange(FRAMES) + 7 * k, HEIGHT, WIDTH, 20 + k), seed=k)
        (files / f"rec{k:02d}.dat").write_bytes(vidar_bytes(spikes))
        paths.append(files / f"rec{k:02d}.dat")
    return paths
