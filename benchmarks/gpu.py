"""GPU figures (only where torch.cuda.is_available()): host-to-device bandwidth, on-device densify
rate, and the loader with device="cuda" (cells/s and how long the trainer waits for each batch)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

NOT_MEASURED = "not measured (no CUDA device)"


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def h2d_gbps(nbytes: int, repeats: int = 20, device: str = "cuda") -> dict[str, float]:
    import torch

    host = torch.empty(nbytes // 4, dtype=torch.float32)
    if device.startswith("cuda"):
        host = host.pin_memory()
    dev = torch.empty_like(host, device=device)
    dev.copy_(host, non_blocking=True)
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {"bytes": nbytes, "gb_per_s": nbytes / 1e9 / statistics.median(times)}


def densify_rate(
    h5ad: str,
    n_genes: int,
    rows: int = 4096,
    repeats: int = 20,
    device: str = "cuda",
) -> dict[str, float]:
    """CSR rows (real data) already on the GPU -> dense float32, timed on the device."""
    import h5py
    import torch

    with h5py.File(h5ad, "r") as f:
        g = f["X"]
        indptr = g["indptr"][: rows + 1].astype(np.int64)
        indices = g["indices"][: int(indptr[-1])].astype(np.int64)
        data = g["data"][: int(indptr[-1])].astype(np.float32)
    n = indptr.size - 1
    t = torch.sparse_csr_tensor(
        torch.from_numpy(indptr).to(device),
        torch.from_numpy(indices).to(device),
        torch.from_numpy(data).to(device),
        size=(n, n_genes),
    )
    t.to_dense()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        t.to_dense()
        _sync(device)
        times.append(time.perf_counter() - t0)
    s = statistics.median(times)
    return {"rows": n, "cells_per_s": n / s, "dense_gb_per_s": n * n_genes * 4 / 1e9 / s}


def loader_on_cuda(
    root: str,
    n_genes: int,
    batch_size: int,
    workers: int,
    seconds: float,
    device: str | None = "cuda",
    window: int = 4,
) -> dict[str, Any]:
    """Cells/s of ``ShardLoader(device=device)`` over ``seconds`` of epochs after a warm-up epoch
    (persistent workers), and how long the trainer waits for each batch (the consumer stream
    synchronised: the batch is usable; until 2026-11-26 the whole device was, which also waited
    for the batches staged behind it). ``device=None``: the host loader (for reference in the
    same run, and the worker scan of ``benchmarks.device_check``)."""
    import torch

    from benchmarks.measure import payload
    from loaders import ShardDataset, ShardLoader

    ds = ShardDataset(
        root,
        split="train",
        sample="cells",
        batch_size=batch_size,
        shuffle=True,
        seed=0,
        window=window,
    )
    cuda = device is not None and device.startswith("cuda")
    dl = ShardLoader(
        ds, num_workers=workers, pin_memory=cuda, device=device, persistent_workers=workers > 0
    )
    t0 = time.perf_counter()
    dl.set_epoch(0)
    it = iter(dl)
    next(it)
    ttfb = time.perf_counter() - t0
    for _ in it:  # the rest of the first epoch: decode, workers' start
        pass
    waits, cells, epoch = [], 0, 1
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < seconds:
        dl.set_epoch(epoch)
        epoch += 1
        it = iter(dl)
        while True:
            tw = time.perf_counter()
            batch = next(it, None)
            if batch is None:
                break
            if (
                cuda
            ):  # usable: the consumer stream has waited for this batch's copy and finish (not the
                # batches staged behind it, as a device-wide sync would)
                torch.cuda.current_stream().synchronize()
            waits.append(time.perf_counter() - tw)
            cells += payload(batch, n_genes)[0]
    el = time.perf_counter() - t1
    return {
        "num_workers": workers,
        "device": device or "host",
        "cells_per_s": cells / el if el > 0 else 0.0,
        "ttfb_s": ttfb,
        "epochs": epoch - 1,
        "gpu_wait_ms_median": 1e3 * statistics.median(waits) if waits else None,
        "gpu_wait_ms_p95": 1e3 * float(np.percentile(waits, 95)) if waits else None,
        "batches": len(waits),
    }


def run_gpu(spec: dict[str, Any]) -> dict[str, Any]:
    """The GPU section; ``spec["device"] = "cpu"`` dry-runs the same code without CUDA (for
    testing)."""
    device = spec.get("device", "cuda")
    if device.startswith("cuda") and not cuda_available():
        return {"status": NOT_MEASURED}
    import torch

    n_genes, bs = int(spec["n_genes"]), int(spec["batch_size"])
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else device
    out: dict[str, Any] = {"status": "measured", "device": name}
    out["h2d_batch"] = h2d_gbps(bs * n_genes * 4, device=device)
    out["h2d_64mb"] = h2d_gbps(64 << 20, device=device)
    out["densify"] = densify_rate(spec["h5ad"], n_genes, device=device)
    out["loader"] = []
    if spec.get("shards_root"):
        for w in spec["workers"]:
            for dev in (device, None):  # the host loader in the same run, for reference
                try:
                    out["loader"].append(
                        loader_on_cuda(
                            spec["shards_root"], n_genes, bs, w, float(spec["seconds"]), device=dev
                        )
                    )
                except Exception as e:
                    out["loader"].append(
                        {
                            "num_workers": w,
                            "device": dev or "host",
                            "error": f"{type(e).__name__}: {e}",
                        }
                    )
    return out
