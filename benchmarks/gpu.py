"""GPU figures (only where torch.cuda.is_available()): host-to-device bandwidth, on-device densify rate, and the
loader with device="cuda" (cells/s and how long the trainer waits for each batch)."""

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


def densify_rate(h5ad: str, n_genes: int, rows: int = 4096, repeats: int = 20, device: str = "cuda",
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
    t = torch.sparse_csr_tensor(torch.from_numpy(indptr).to(device), torch.from_numpy(indices).to(device),
                                torch.from_numpy(data).to(device), size=(n, n_genes))
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


def loader_on_cuda(root: str, n_genes: int, batch_size: int, workers: int, seconds: float,
                   warmup: int, device: str = "cuda") -> dict[str, Any]:
    from benchmarks.loaders_bench import shard_loader_factory
    from benchmarks.measure import payload

    _dl, make = shard_loader_factory(root, "cells", batch_size, workers, device=device)
    sink: list[str] = []
    it = make(0, sink)
    t0 = time.perf_counter()
    next(it)
    ttfb = time.perf_counter() - t0
    for _ in range(warmup):
        next(it)
    waits, cells = [], 0
    t1 = time.perf_counter()
    for _ in range(100_000):
        tw = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        _sync(device)
        waits.append(time.perf_counter() - tw)
        cells += payload(batch, n_genes)[0]
        if time.perf_counter() - t1 >= seconds:
            break
    el = time.perf_counter() - t1
    it.close()
    return {"num_workers": workers, "cells_per_s": cells / el if el > 0 else 0.0, "ttfb_s": ttfb,
            "gpu_wait_ms_median": 1e3 * statistics.median(waits) if waits else None,
            "gpu_wait_ms_p95": 1e3 * float(np.percentile(waits, 95)) if waits else None, "batches": len(waits)}


def run_gpu(spec: dict[str, Any]) -> dict[str, Any]:
    """The GPU section; ``spec["device"] = "cpu"`` dry-runs the same code without CUDA (for testing)."""
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
            try:
                out["loader"].append(loader_on_cuda(spec["shards_root"], n_genes, bs, w, float(spec["seconds"]),
                                                    int(spec["warmup"]), device=device))
            except Exception as e:
                out["loader"].append({"num_workers": w, "error": f"{type(e).__name__}: {e}"})
    return out
