"""One prepared run on a lent GPU node (the device machine: a GPU, 16 cores, no network, no build tools of ours).

    python -m benchmarks.device_check --data .devdata --out $OUT

Everything it reads is made beforehand on the CPU machine, under ``--data``: ``cells/`` (shards of the bench's
synthetic screen), ``csr.h5`` (4,096 CSR rows of it, h5py), ``gpu_spike/`` (the demo spike build,
``benchmarks.gpu_spike.demo_build``). It measures, on the device's own CPU and GPU:

* the GPU section of ``make bench`` (``benchmarks.gpu.run_gpu``): host-to-device GB/s, on-device densify, and
  ``ShardLoader(device="cuda")`` (CSR parts shipped, densified on the GPU) with the trainer's wait per batch,
  ``num_workers`` 0, 2 and 4;
* the host loader's rate for ``num_workers`` 0, 1, 2, 4, 8 on 16 cores (dense, persistent workers, the
  whole split one window): what docs/LOADER.md says to expect on 16+ cores, measured;
* the spike voxel op and loader on the GPU (``benchmarks.gpu_spike``), equal to numpy or an error.

Results go to ``--out/device.json`` and a markdown summary to stdout. Not interleaved across processes: the
rates of the worker scan are from consecutive windows of one process, on a machine nobody else uses.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def worker_scan(root: str, workers: tuple[int, ...], seconds: float, batch_size: int = 256) -> list[dict[str, Any]]:
    from benchmarks.interleaved import rows_of
    from loaders import ShardDataset, ShardLoader

    out = []
    for w in workers:
        ds = ShardDataset(root, split="train", sample="cells", batch_size=batch_size, seed=0, window=8)
        dl = ShardLoader(ds, num_workers=w, persistent_workers=w > 0)
        e, rows, t0, started = 0, 0, 0.0, False
        while True:
            dl.set_epoch(e)
            e += 1
            for b in dl:
                if not started and e > 1:  # the first epoch warms up (decode, workers' start)
                    started, t0 = True, time.perf_counter()
                elif started:
                    rows += rows_of(b)
            if started and time.perf_counter() - t0 >= seconds:
                break
        out.append({"num_workers": w, "cells_per_s": rows / (time.perf_counter() - t0), "epochs": e})
        print(f"[device] host loader num_workers={w}: {out[-1]['cells_per_s']:,.0f} cells/s", flush=True)
        del dl, ds
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=".devdata")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args(argv)
    import torch

    from benchmarks.gpu import run_gpu
    from benchmarks.gpu_spike import run_gpu_spike, table

    data = Path(a.data)
    res: dict[str, Any] = {"torch": torch.__version__, "cpus": os.cpu_count(),
                           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    print(f"[device] {res}", flush=True)
    res["gpu_cells"] = run_gpu({"n_genes": 2000, "batch_size": 256, "h5ad": str(data / "csr.h5"),
                                "shards_root": str(data / "cells"), "workers": [0, 2, 4], "seconds": a.seconds,
                                "warmup": 5})
    print(f"[device] gpu cells: {json.dumps(res['gpu_cells'])}", flush=True)
    res["host_workers"] = worker_scan(str(data / "cells"), (0, 1, 2, 4, 8), a.seconds)
    spike = run_gpu_spike(data / "gpu_spike", "cuda", seconds=2.0, repeats=3)
    res["gpu_spike"] = spike
    Path(a.out, "device.json").write_text(json.dumps(res, indent=1, default=str))
    print(table(spike), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
