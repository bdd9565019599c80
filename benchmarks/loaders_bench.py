"""Loader throughput: our ShardLoader against baselines, on the same data, in an isolated child
process.

Each task runs in its own interpreter (``python -m benchmarks.loaders_bench SPEC.json OUT.json``)
so its peak RSS (main process + DataLoader workers, sampled in a thread) is its own. Every method
delivers random batches of dense float32 rows; the figures span epoch boundaries (a new shuffle
every epoch, start-ups included) after warm-up, median of the repeats.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.measure import (
    EpochChain,
    RssSampler,
    Summary,
    load_csr,
    measure_once,
    summarize,
    warm_page_cache,
)

BASELINES = ("scipy", "h5py", "anndata", "scdataset")


def epoch_batches(n: int, batch_size: int, epoch: int) -> Iterator[np.ndarray]:
    """One epoch of a true shuffle: a fresh permutation of all rows, cut into batches."""
    perm = np.random.default_rng(epoch).permutation(n)
    for i in range(0, n - batch_size + 1, batch_size):
        yield perm[i : i + batch_size]


def scipy_iter(x: Any, batch_size: int, epoch: int) -> Iterator[Any]:
    import torch

    for idx in epoch_batches(x.shape[0], batch_size, epoch):
        yield torch.from_numpy(x[idx].toarray())


def h5py_iter(
    f: Any, indptr: np.ndarray, n_genes: int, batch_size: int, epoch: int
) -> Iterator[Any]:
    import torch

    data, indices = f["X/data"], f["X/indices"]
    for idx in epoch_batches(indptr.size - 1, batch_size, epoch):
        idx = np.sort(idx)
        out = np.zeros((idx.size, n_genes), dtype=np.float32)
        for j, r in enumerate(idx):
            s, e = int(indptr[r]), int(indptr[r + 1])
            if e > s:
                out[j, indices[s:e]] = data[s:e]
        yield torch.from_numpy(out)


def anndata_iter(xb: Any, n: int, batch_size: int, epoch: int) -> Iterator[Any]:
    import torch

    for idx in epoch_batches(n, batch_size, epoch):
        yield torch.from_numpy(xb[np.sort(idx)].toarray())


def fetch_anndata(adata: Any, indices: np.ndarray) -> np.ndarray:
    """scDataset's documented fetch callback for AnnData (densify the fetched rows)."""
    data = adata[indices].X
    if hasattr(data, "toarray"):
        data = data.toarray()
    return data.astype(np.float32)


def run_baseline(spec: dict[str, Any], method: str, sampler: RssSampler) -> list[Summary]:
    n_genes, bs, reps = int(spec["n_genes"]), int(spec["batch_size"]), int(spec["repeats"])
    common = {"warmup": int(spec["warmup"]), "seconds": float(spec["seconds"])}
    path = spec["h5ad"]
    sampler.reset()
    out: list[Summary] = []
    if method == "scipy":
        x = load_csr(path)
        runs = [
            measure_once(
                lambda r=r: EpochChain(lambda e: scipy_iter(x, bs, e), 1000 * r), n_genes, **common
            )
            for r in range(reps)
        ]
        out.append(
            summarize(
                "scipy in-memory gather+densify",
                {"batch_size": bs},
                runs,
                sampler,
                "whole CSR in RAM; X[random idx].toarray(); the memory-bound limit",
            )
        )
    elif method == "h5py":
        import h5py

        with h5py.File(path, "r") as f:
            indptr = f["X/indptr"][:]
            runs = [
                measure_once(
                    lambda r=r: EpochChain(
                        lambda e: h5py_iter(f, indptr, n_genes, bs, e), 1000 * r
                    ),
                    n_genes,
                    **common,
                )
                for r in range(reps)
            ]
        out.append(
            summarize(
                "h5py CSR row gather",
                {"batch_size": bs},
                runs,
                sampler,
                "indptr in memory; two slice reads per row (sorted rows); densify",
            )
        )
    elif method == "anndata":
        import anndata

        adata = anndata.read_h5ad(path, backed="r")
        xb, n = adata.X, adata.n_obs
        runs = [
            measure_once(
                lambda r=r: EpochChain(lambda e: anndata_iter(xb, n, bs, e), 1000 * r),
                n_genes,
                **common,
            )
            for r in range(reps)
        ]
        out.append(
            summarize(
                "anndata backed",
                {"batch_size": bs},
                runs,
                sampler,
                "read_h5ad(backed='r'); adata.X[sorted idx].toarray()",
            )
        )
    elif method == "scdataset":
        out.extend(run_scdataset(spec, sampler))
    return out


def run_scdataset(spec: dict[str, Any], sampler: RssSampler) -> list[Summary]:
    import anndata
    from scdataset import BlockShuffling, scDataset
    from torch.utils.data import DataLoader

    n_genes, bs, reps = int(spec["n_genes"]), int(spec["batch_size"]), int(spec["repeats"])
    ff, block = int(spec.get("scd_fetch_factor", 16)), int(spec.get("scd_block_size", 16))
    out = []
    for workers in spec.get("scd_workers", [0]):
        sampler.reset()
        adata = anndata.read_h5ad(spec["h5ad"], backed="r")
        ds = scDataset(
            adata,
            BlockShuffling(block_size=block),
            batch_size=bs,
            fetch_factor=ff,
            fetch_callback=fetch_anndata,
            seed=0,
        )
        kw: dict[str, Any] = (
            {"prefetch_factor": ff + 1, "persistent_workers": False} if workers else {}
        )
        dl = DataLoader(ds, batch_size=None, num_workers=workers, **kw)
        runs = [
            measure_once(
                lambda dl=dl: EpochChain(lambda _e: iter(dl)),
                n_genes,
                warmup=ff,
                seconds=float(spec["seconds"]),
                min_batches=ff,
                multiple_of=ff if workers == 0 else 1,
            )
            for _ in range(reps)
        ]
        out.append(
            summarize(
                f"scDataset (w={workers})",
                {"batch_size": bs, "num_workers": workers, "fetch_factor": ff, "block_size": block},
                runs,
                sampler,
                f"anndata backed, BlockShuffling(block_size={block}) (shuffles blocks, not single "
                f"cells), fetch_factor={ff}",
            )
        )
        del dl, ds, adata
    return out


class EpochProbe:
    """Wraps a loader iterator, remembering a fingerprint of the first batch (to check per-epoch
    reshuffles)."""

    def __init__(self, it: Iterator[Any], sink: list[str]) -> None:
        self.it, self.sink, self.first = it, sink, True

    def __iter__(self) -> EpochProbe:
        return self

    def __next__(self) -> Any:
        batch = next(self.it)
        if self.first:
            self.first = False
            key = "sample_id" if isinstance(batch, dict) and "sample_id" in batch else None
            t = (
                batch[key]
                if key
                else (next(iter(batch.values())) if isinstance(batch, dict) else batch)
            )
            self.sink.append(
                hashlib.sha1(t[:8].contiguous().cpu().numpy().tobytes()).hexdigest()[:12]
            )
        return batch

    def close(self) -> None:
        close = getattr(self.it, "close", None)
        if close is not None:
            close()
        self.it = iter(())


def shard_loader_factory(
    root: str,
    sample: str,
    batch_size: int,
    workers: int,
    device: str | None = None,
) -> tuple[Any, Callable[[int, list[str]], Iterator[Any]]]:
    from loaders import ShardDataset, ShardLoader

    ds = ShardDataset(
        root, split="train", sample=sample, batch_size=batch_size, shuffle=True, seed=0
    )
    cuda = device is not None and device.startswith("cuda")
    dl = ShardLoader(ds, num_workers=workers, pin_memory=cuda, device=device if cuda else None)

    def make(epoch: int, sink: list[str]) -> Iterator[Any]:
        dl.set_epoch(epoch)
        return EpochProbe(iter(dl), sink)

    return dl, make


def measure_shards(spec: dict[str, Any], sample: str, workers: int, sampler: RssSampler) -> Summary:
    bs = int(spec["batch_size"]) if sample != "sentences" else int(spec["sentence_batch"])
    params = {"sample": sample, "num_workers": workers, "batch_size": bs, "codec": spec["codec"]}
    name = f"shards {spec['codec']} {sample} (w={workers})"
    sampler.reset()
    firsts: list[str] = []
    try:
        _dl, make = shard_loader_factory(spec["shards_root"], sample, bs, workers)
        runs = [
            measure_once(
                lambda r=r: EpochChain(lambda e: make(e, firsts), 1000 * r),
                int(spec["n_genes"]),
                warmup=int(spec["warmup"]),
                seconds=float(spec["seconds"]),
            )
            for r in range(int(spec["repeats"]))
        ]
    except Exception as e:  # one failing mode must not lose the others
        return Summary(
            name,
            params,
            0.0,
            0.0,
            0.0,
            sampler.peak / (1 << 20),
            sampler.start_rss / (1 << 20),
            note=f"FAILED: {type(e).__name__}: {e}",
        )
    reshuffled = len(firsts) > 1 and len(set(firsts)) == len(firsts)
    note = f"{len(firsts)} epochs started, first batches {'all differ' if reshuffled else 'REPEAT'}"
    return summarize(name, {**params, "reshuffled": reshuffled}, runs, sampler, note)


def run_shards(spec: dict[str, Any], sampler: RssSampler) -> list[Summary]:
    return [
        measure_shards(spec, sample, w, sampler)
        for sample in spec["samples"]
        for w in spec["workers"]
    ]


def run_task(spec: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    task = spec["task"]
    import torch  # noqa: F401 - imported before sampling starts, so every method's RSS includes it equally

    warm = warm_page_cache(spec.get("warm_paths", []))
    if task == "interleaved":  # no sampler thread: its memory figures are read between windows
        from benchmarks.interleaved import run_interleaved, run_workers

        il = run_interleaved(spec)
        il["workers_scan"] = run_workers(spec) if spec.get("workers_scan") else []
        return {
            "task": task,
            "interleaved": il,
            "page_cache_warmed_bytes": warm,
            "seconds": time.perf_counter() - t0,
        }
    with RssSampler() as sampler:
        if task in BASELINES:
            results = run_baseline(spec, task, sampler)
        elif (
            task == "baselines"
        ):  # several in one interpreter (quick runs): RSS no longer isolated per method
            results = [s for m in spec["methods"] for s in run_baseline(spec, m, sampler)]
        elif task == "shards":
            results = run_shards(spec, sampler)
        elif task == "gpu":
            from benchmarks.gpu import run_gpu

            return {"task": task, "gpu": run_gpu(spec), "seconds": time.perf_counter() - t0}
        else:
            raise ValueError(f"unknown task {task!r}")
    return {
        "task": task,
        "results": [r.to_json() for r in results],
        "page_cache_warmed_bytes": warm,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec_path, out_path = Path(argv[0]), Path(argv[1])
    spec = json.loads(spec_path.read_text())
    try:
        doc = run_task(spec)
    except Exception as e:
        doc = {
            "task": spec.get("task"),
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc(),
        }
    out_path.write_text(json.dumps(doc, indent=1))
    return 0 if "error" not in doc else 1


if __name__ == "__main__":
    sys.exit(main())
