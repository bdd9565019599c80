"""The spike voxel op on a GPU: does ``device="cuda"`` give the numpy result, and how fast is it?

    python -m benchmarks.gpu_spike --work-dir /tmp/gpu_spike            # needs CUDA; else says so
    and exits 0
    python -m benchmarks.gpu_spike --work-dir /tmp/gpu_spike --device cpu   # dry run of the same
    code (tests)

Three parts, each on the device named (``cuda`` by default):

* ``kernel``: packed bits shaped like the spike bench (250 x 400, 40 frames, crops of 128 x 128 and
odd
  ones, clips of 1 and 3, 5 and 4 bins), in both bit orders, through the numpy finisher on the host
  (``voxel_pixel_numpy`` / ``voxel_numpy``) and its torch twin on the device: equal
  element for element (a mismatch raises :class:`ParityError`; the result is never reported as
  measured);
  then the median time per batch of each, the device time counting the pinned host-to-device copy of
  the
  packed bits (what the loader ships) and the synchronisation.
* ``loader``: the demo spike tree built (zarr, pixel-major) and read, with 4 and 5 bins, by
``ShardLoader(device=device)`` and by
  ``ShardLoader(device=None)`` with the same seed, shuffle and crop, ``num_workers`` 0 and 2: every
  key of
  every batch equal.
* ``loader_rate``: samples/s of both loaders over that build, interleaved windows, median.

Why a separate module: the lead runs it on a lent GPU; ``make bench`` has no GPU on the build
machines, and a CUDA check that silently fell back to the CPU would prove nothing, so without
CUDA it reports ``not measured`` instead of timing the CPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

NOT_MEASURED = "not measured (no CUDA device)"
CASES = (  # (crop or None, clip_len): batch of 8 units
    (None, 1),
    ((128, 128), 1),
    ((17, 21), 3),
    ((250, 400), 1),
    ((5, 393), 1),
)


class ParityError(AssertionError):
    """The device result differs from numpy's: the figures must not be used."""


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _case(
    rng: np.random.Generator,
    crop: tuple[int, int] | None,
    clip_len: int,
    b: int = 8,
    size: tuple[int, int] = (250, 400),
    frames: int = 40,
) -> tuple[np.ndarray, np.ndarray, int]:
    from loaders.modalities.spike.samples import crop_bits, crop_offsets

    windows = list(
        rng.integers(0, 256, (b * clip_len, frames, size[0], -(-size[1] // 8)), dtype=np.uint8)
    )
    offsets = crop_offsets(int(rng.integers(1 << 30)), 0, np.arange(b), size, crop)
    bits, left = crop_bits(windows, offsets, crop, clip_len)
    return bits, left, (crop[1] if crop else size[1])


def _median_s(fn: Any, repeats: int, device: str) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _pixel_case(
    rng: np.random.Generator,
    crop: tuple[int, int] | None,
    clip_len: int,
    b: int = 8,
    size: tuple[int, int] = (250, 400),
    frames: int = 40,
) -> np.ndarray:
    from loaders.modalities.spike.ops import crop_pixels
    from loaders.modalities.spike.samples import crop_offsets

    windows = list(
        rng.integers(0, 256, (b * clip_len, size[0], size[1], -(-frames // 8)), dtype=np.uint8)
    )
    offsets = crop_offsets(int(rng.integers(1 << 30)), 0, np.arange(b), size, crop)
    return crop_pixels(windows, offsets, crop, clip_len)


def _kernels(
    rng: np.random.Generator,
    crop: tuple[int, int] | None,
    clip_len: int,
    num_bins: int,
    frames: int = 40,
) -> dict[str, tuple[Any, Any, np.ndarray]]:
    """Bit order -> (numpy finisher, torch finisher taking the shipped device arrays, the packed
    bits)."""
    import torch

    from loaders.modalities.spike import torch_ops as spike_torch
    from loaders.modalities.spike.ops import voxel_pixel_numpy
    from loaders.modalities.spike.samples import voxel_numpy

    bits, left, width = _case(rng, crop, clip_len)
    pixel = _pixel_case(rng, crop, clip_len)
    left_t = torch.from_numpy(left)
    return {
        "frame_major": (
            functools.partial(voxel_numpy, bits, left, width, num_bins, clip_len),
            lambda x, device: spike_torch.voxel_torch(
                x, left_t.to(device), width, num_bins, clip_len
            ),
            bits,
        ),
        "pixel_major": (
            functools.partial(voxel_pixel_numpy, pixel, frames, num_bins, clip_len),
            lambda x, device: spike_torch.voxel_pixel_torch(x, frames, num_bins, clip_len),
            pixel,
        ),
    }


def kernel(
    device: str,
    repeats: int = 10,
    bins: tuple[int, ...] = (5, 4),
    cases: tuple[tuple[tuple[int, int] | None, int], ...] = CASES,
) -> list[dict[str, Any]]:
    """Parity and time of the voxel finishers per case, bit order and bin count (5: 8 frames a bin,
    the popcount path; 4: 10, unpacked): see the module docstring."""
    import torch

    rng = np.random.default_rng(0)
    out = []
    for (crop, clip_len), num_bins in ((c, n) for c in cases for n in bins):
        for order, (on_host, finish, bits) in _kernels(rng, crop, clip_len, num_bins).items():
            want = on_host()
            host = torch.from_numpy(bits)
            if device.startswith("cuda"):
                host = host.pin_memory()

            def on_device(host: Any = host, finish: Any = finish) -> Any:
                return finish(host.to(device, non_blocking=True), device)

            got = on_device().cpu().numpy()
            if got.shape != want.shape or not np.array_equal(got, want):
                bad = int((got != want).sum()) if got.shape == want.shape else -1
                raise ParityError(
                    f"the torch voxel op ({order}) on {device} differs from voxel_numpy for "
                    f"crop={crop}, clip_len={clip_len}, num_bins={num_bins}: {bad} elements "
                    f"(-1: shapes {got.shape} vs {want.shape})"
                )
            t_np = _median_s(on_host, repeats, "cpu")
            t_dev = _median_s(on_device, repeats, device)
            units = bits.shape[0] // clip_len
            out.append(
                {
                    "bit_order": order,
                    "crop": list(crop) if crop else None,
                    "clip_len": clip_len,
                    "num_bins": num_bins,
                    "units": units,
                    "equal": True,
                    "packed_bytes": int(bits.nbytes),
                    "numpy_ms": 1e3 * t_np,
                    "device_ms": 1e3 * t_dev,
                    "numpy_units_per_s": units / t_np,
                    "device_units_per_s": units / t_dev,
                }
            )
    return out


def demo_build(work: Path) -> Path:
    """The demo spike tree (pipeline.modalities.spike.demo) built as zarr under ``work`` (reused
    when present)."""
    from pipeline.build import build
    from pipeline.modalities.spike.demo import write_spike_demo

    out = work / "shards"
    if (out / "index.json").exists():
        return out
    shutil.rmtree(work, ignore_errors=True)
    write_spike_demo(work / "data")
    text = (
        Path(__file__).resolve().parent.parent / "data_manifests" / "demo_spike.toml"
    ).read_text()
    manifest = work / "demo_spike.toml"
    manifest.write_text(
        text.replace('"../data/demo/spike"', json.dumps(str(work / "data" / "spike")))
    )
    build(manifest, out, jobs=1, progress=False)
    return out


def _loader(root: Path, device: str | None, workers: int, seed: int = 0, num_bins: int = 4) -> Any:
    from loaders import ShardDataset, ShardLoader

    ds = ShardDataset(
        root,
        split="train",
        sample="spike",
        batch_size=2,
        num_bins=num_bins,
        crop=(24, 40),
        seed=seed,
    )
    # ship_csr=True on the CPU too: the dry run exercises the shipped-parts path the GPU takes
    return ShardLoader(ds, num_workers=workers, device=device, ship_csr=device is not None)


def loader_parity(
    root: Path,
    device: str,
    workers: tuple[int, ...] = (0, 2),
    epochs: int = 2,
    bins: tuple[int, ...] = (4, 5),
) -> list[dict]:
    import torch

    out = []
    for w, n in ((w, n) for w in workers for n in bins):  # 10 frames a bin (unpacked), 8 (popcount)
        ref, dev = _loader(root, None, w, num_bins=n), _loader(root, device, w, num_bins=n)
        batches = 0
        for e in range(epochs):
            ref.set_epoch(e)
            dev.set_epoch(e)
            for a, b in zip(ref, dev, strict=True):
                if sorted(a) != sorted(b):
                    raise ParityError(f"keys differ: {sorted(a)} vs {sorted(b)}")
                for k in a:
                    x, y = a[k], b[k]
                    y = y.cpu() if isinstance(y, torch.Tensor) else y
                    if isinstance(x, torch.Tensor) and not torch.equal(x, y):
                        raise ParityError(
                            f"num_workers={w}, epoch {e}, batch {batches}: {k!r} differs on {device}"
                        )
                batches += 1
        out.append({"num_workers": w, "num_bins": n, "batches": batches, "equal": True})
    return out


def loader_rate(
    root: Path, device: str, workers: int, seconds: float, repeats: int
) -> dict[str, Any]:
    from benchmarks.spike_bench import Chain, interleaved

    loaders = {
        "host (numpy)": _loader(root, None, workers),
        f"device ({device})": _loader(root, device, workers),
    }

    def chain(ld: Any) -> Chain:
        def epoch(e: int) -> Any:
            ld.set_epoch(e)
            for b in ld:
                _sync(device)  # the batch is ready to train on, not merely queued
                yield b

        return Chain(epoch)

    res = interleaved({k: chain(v) for k, v in loaders.items()}, seconds, repeats)
    return {"num_workers": workers, **res}


def run_gpu_spike(
    work_dir: str | Path,
    device: str = "cuda",
    seconds: float = 2.0,
    repeats: int = 3,
    workers: int = 0,
) -> dict[str, Any]:
    """Everything above; ``{"status": NOT_MEASURED}`` without CUDA unless ``device="cpu"`` (dry
    run)."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        return {"status": NOT_MEASURED}
    name = (
        torch.cuda.get_device_name(0)
        if device.startswith("cuda")
        else f"{device} (dry run, not a GPU figure)"
    )
    root = demo_build(Path(work_dir))
    return {
        "status": "measured",
        "device": name,
        "kernel": kernel(device, repeats=max(3, 3 * repeats)),
        "loader": loader_parity(root, device),
        "loader_rate": loader_rate(root, device, workers, seconds, repeats),
    }


def table(r: dict[str, Any]) -> str:
    if r.get("status") != "measured":
        return f"Spike on GPU: {r.get('status')}"
    lines = [
        f"Spike voxel op on {r['device']} (8 units a batch, 40 frames of 250x400 packed, 5 bins; device time "
        "includes the pinned copy of the packed bits); every case equal to numpy:",
        "",
        "| crop | clip_len | packed KB | numpy ms | device ms | speed-up |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for k in r["kernel"]:
        crop = "x".join(map(str, k["crop"])) if k["crop"] else "none"
        lines.append(
            f"| {crop} | {k['clip_len']} | {k['packed_bytes'] / 1e3:.0f} | {k['numpy_ms']:.2f} | "
            f"{k['device_ms']:.2f} | {k['numpy_ms'] / k['device_ms']:.1f}x |"
        )
    par = ", ".join(
        f"num_workers={p['num_workers']}: {p['batches']} batches equal" for p in r["loader"]
    )
    lines += ["", f"Loader parity (demo build, device vs host): {par}.", ""]
    lr = r["loader_rate"]
    lines += [
        f"Loader samples/s (demo build, num_workers={lr['num_workers']}): "
        + ", ".join(f"{k} {v['samples_per_s']:.0f}" for k, v in lr.items() if isinstance(v, dict))
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work-dir", default="bench_data/work/gpu_spike")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    r = run_gpu_spike(a.work_dir, a.device, a.seconds, a.repeats, a.workers)
    print(table(r))
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
