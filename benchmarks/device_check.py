"""One prepared run on a lent GPU node (the device machine: a GPU, 16 cores, no network, no build
tools of ours).

    python -m benchmarks.device_check --prepare --data .devdata     # here, on the CPU machine (~1
    min)
    python -m benchmarks.device_check --data .devdata --out $OUT    # there (after
    python -m pip install --no-index --no-deps .whl/*.whl: the node's bare pip is another Python's)

Everything it reads is made beforehand on the CPU machine by ``--prepare``, under ``--data`` (~46
MB, under the device tool's 64 MiB with zarr/numcodecs wheels): ``cells/`` (shards of the bench's
synthetic screen, 50k x 2,000), ``csr.h5`` (4,096 CSR rows of it, h5py), ``gpu_spike/`` (the demo
spike build, ``benchmarks.gpu_spike.demo_build``). It measures, on the device's own CPU and GPU:

* the GPU section of ``make bench`` (``benchmarks.gpu.run_gpu``): host-to-device GB/s, on-device
densify, and
  ``ShardLoader(device="cuda")`` (CSR parts shipped, densified on the GPU) with the trainer's wait
  per batch,
  ``num_workers`` 0, 2 and 4;
* the host loader's rate for ``num_workers`` 0, 1, 2, 4, 8 on 16 cores (dense, persistent workers,
the
  whole split one window): what docs/LOADER.md says to expect on 16+ cores, measured;
* the spike voxel op and loader on the GPU (``benchmarks.gpu_spike``), equal to numpy or an error;
* cells, pairs and sentences through ``device="cuda"`` equal to the host loader's, key by key (or an
error);
* the engine choice (``benchmarks.engine_choice``, docs/LOADER.md "Engine choice"): the decoder
  process against per-process decode for ``num_workers`` 0, 2, 4, 8, dense and sparse, host and
  ``device="cuda"`` (interleaved in one process per W), and each configuration's peak PSS / RSS in
  a fresh process: the figures this issue's decision waits for on 16 cores.

Results go to ``--out/device.json`` and a markdown summary to stdout. Not interleaved across
processes: the rates of the worker scan are from consecutive windows of one process, on a machine
nobody else uses.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def worker_scan(root: str, workers: tuple[int, ...], seconds: float) -> list[dict[str, Any]]:
    """The host loader (dense, the whole split one window) for each ``num_workers``:
    ``benchmarks.gpu``'s loader measure with ``device=None``."""
    from benchmarks.gpu import loader_on_cuda

    out = []
    for w in workers:
        out.append(loader_on_cuda(root, 2000, 256, w, seconds, device=None, window=8))
        print(
            f"[device] host loader num_workers={w}: {out[-1]['cells_per_s']:,.0f} cells/s",
            flush=True,
        )
    return out


def engine_part(root: str, seconds: float) -> dict[str, Any]:
    """The engine choice on this node: W = 0, 2, 4, 8, host and (with CUDA) ``device="cuda"``,
    3 interleaved rounds per W, then peak memory per configuration (2 epochs, fresh processes)."""
    import torch

    from benchmarks.engine_choice import memory, speed, table

    devices = ["host", "cuda"] if torch.cuda.is_available() else ["host"]
    workers = [0, 2, 4, 8]
    speeds = speed(root, workers, 2, min(seconds, 2.0), 3, devices)
    mems = memory(root, workers, 2, 2)
    print(table(speeds, mems), flush=True)
    return {"speed": speeds, "memory": mems, "load": os.getloadavg()}


def cells_parity(root: str, workers: tuple[int, ...] = (0, 2)) -> list[dict[str, Any]]:
    """``device="cuda"`` (CSR parts shipped, densified on the GPU) against ``device=None``: every
    key of every batch equal, for cells, pairs and sentences, dense and ``densify=False``; raises
    on the first difference."""
    import torch

    from loaders import ShardDataset, ShardLoader

    if not torch.cuda.is_available():
        return [{"status": "not measured (no CUDA device)"}]
    out = []
    for sample, densify, w in (
        (s, d, w) for s in ("cells", "pairs", "sentences") for d in (True, False) for w in workers
    ):
        kw = {
            "sample": sample,
            "batch_size": 2 if sample == "sentences" else 128,
            "seed": 3,
            "densify": densify,
        }
        host = ShardLoader(ShardDataset(root, split="train", **kw), num_workers=w)  # type: ignore[arg-type]
        dev = ShardLoader(ShardDataset(root, split="train", **kw), num_workers=w, device="cuda")  # type: ignore[arg-type]
        n = 0
        for e in (0, 1):
            host.set_epoch(e)
            dev.set_epoch(e)
            for a, b in zip(host, dev, strict=True):
                assert sorted(a) == sorted(b), (sorted(a), sorted(b))
                for k in a:
                    x, y = a[k], b[k]
                    if isinstance(x, torch.Tensor):
                        assert y.device.type == "cuda", (k, y.device)
                        assert x.dtype == y.dtype and torch.equal(x, y.cpu()), (
                            f"{sample} w={w} epoch {e}: {k} differs"
                        )
                n += 1
        out.append(
            {"sample": sample, "densify": densify, "num_workers": w, "batches": n, "equal": True}
        )
        print(
            f"[device] parity {sample} densify={densify} num_workers={w}: {n} batches equal",
            flush=True,
        )
        del host, dev
    return out


def prepare(data: Path, bench_data: Path = Path("bench_data")) -> None:
    """Make ``data`` for a device run (on the CPU machine, where the pipeline and anndata are
    installed)."""
    import h5py

    from benchmarks.gpu_spike import demo_build
    from benchmarks.synth import SynthParams, ensure_dataset, write_manifest
    from pipeline.build import build

    ds = ensure_dataset(SynthParams(n_cells=50_000, n_genes=2_000), bench_data.resolve())
    # 4 MB shards (16 train shards): windows of 2 shards make 8 windows an epoch, so the engine
    # part compares engines that decode while serving (one shard: one window, decoded once)
    manifest = write_manifest(
        data / "cells.toml", ds, name="device-50000", codec="blosc-lz4", shard_size_mb=4
    )
    build(manifest, data / "cells", jobs=1, progress=False)
    with h5py.File(ds.files[0], "r") as f, h5py.File(data / "csr.h5", "w") as o:
        g = f["X"]
        ip = g["indptr"][:4097]
        x = o.create_group("X")
        x["indptr"], x["indices"], x["data"] = (
            ip,
            g["indices"][: int(ip[-1])],
            g["data"][: int(ip[-1])],
        )
    demo_build((data / "gpu_spike").resolve())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=".devdata")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument(
        "--parts",
        default="engine,cells_parity,gpu_cells,host_workers,gpu_spike",
        help="comma list of the parts to run",
    )
    ap.add_argument(
        "--prepare", action="store_true", help="make --data here (CPU machine) and exit"
    )
    a = ap.parse_args(argv)
    if a.prepare:
        prepare(Path(a.data))
        return 0
    parts = set(a.parts.split(","))
    import torch

    from benchmarks.gpu import run_gpu
    from benchmarks.gpu_spike import run_gpu_spike, table

    data = Path(a.data)
    res: dict[str, Any] = {
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    print(f"[device] {res}", flush=True)
    if "engine" in parts:
        res["engine"] = engine_part(str(data / "cells"), a.seconds)
    if "gpu_cells" in parts:
        res["gpu_cells"] = run_gpu(
            {
                "n_genes": 2000,
                "batch_size": 256,
                "h5ad": str(data / "csr.h5"),
                "shards_root": str(data / "cells"),
                "workers": [0, 2, 4],
                "seconds": a.seconds,
            }
        )
        print(f"[device] gpu cells: {json.dumps(res['gpu_cells'])}", flush=True)
    if "cells_parity" in parts:
        res["cells_parity"] = cells_parity(str(data / "cells"))
    if "host_workers" in parts:
        res["host_workers"] = worker_scan(str(data / "cells"), (0, 1, 2, 4, 8), a.seconds)
    if "gpu_spike" in parts:
        res["gpu_spike"] = run_gpu_spike(data / "gpu_spike", "cuda", seconds=2.0, repeats=3)
        print(table(res["gpu_spike"]), flush=True)
    Path(a.out, "device.json").write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
