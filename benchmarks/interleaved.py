"""The loader against its in-memory scipy limits in ONE process, interleaved (the honest ratio).

Why: a baseline timed in another interpreter at another moment moves with this VM's speed (the
same ``X[idx].toarray()`` ran at 531k and at 2M cells/s in two sessions), so a ratio of two
separate runs says little. Here every method is a stream that lives for the whole task; they take
turns, one window of ``seconds`` each (A, B, C, A, B, C ...), for ``rounds`` rounds. A method's
figure is the median of its windows; a ratio is the median over rounds of (loader window / its
baseline's window in the same round).

Baselines: ``X[idx].toarray()`` for dense batches and ``X[idx]`` (scipy's CSR row gather) for
sparse ones, on the whole matrix held in memory as one scipy CSR. Both hand torch tensors back,
as the loader does.

Memory: no sampler thread runs while a window is timed; the process tree's RSS is read between
windows, and the kernel's own high-water mark (``VmHWM``, per process) is read at the end. The
loader's decoder process and its shared windows count in both processes' RSS (shared pages
counted twice).

Decode CPU: the CPU seconds of the decoder process (every window is decoded there, once per
rank), read from ``/proc`` between windows, per epoch started.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from benchmarks.measure import MIB, EpochChain, load_csr, tree_rss

EXPR = ("X", "x_ctrl", "x_pert")


def rows_of(batch: Any) -> int:
    """Expression rows in a batch: dense tensors, CSR parts (``X.crow``), torch sparse or scipy
    matrices."""
    if isinstance(batch, dict):
        n = 0
        for k in EXPR:
            if k in batch:
                t = batch[k]
                n += int(np.prod(t.shape[:-1])) if t.layout != _sparse_csr() else int(t.shape[0])
            elif k + ".crow" in batch:
                n += int(batch[k + ".crow"].shape[0]) - 1
        return n
    if isinstance(batch, tuple):  # (crow, cols, vals) of a baseline
        return int(batch[0].shape[0]) - 1
    return int(np.prod(batch.shape[:-1]))


_SPARSE: list[Any] = []


def _sparse_csr() -> Any:
    if not _SPARSE:
        import torch

        _SPARSE.append(torch.sparse_csr)
    return _SPARSE[0]


def perm_batches(n: int, batch_size: int, epoch: int) -> Iterator[np.ndarray]:
    perm = np.random.default_rng(epoch).permutation(n)
    for i in range(0, n - batch_size + 1, batch_size):
        yield perm[i : i + batch_size]


def scipy_dense(x: Any, bs: int) -> Callable[[int], Iterator[Any]]:
    import torch

    return lambda e: (torch.from_numpy(x[idx].toarray()) for idx in perm_batches(x.shape[0], bs, e))


def scipy_sparse(x: Any, bs: int) -> Callable[[int], Iterator[Any]]:
    import torch

    def it(e: int) -> Iterator[Any]:
        for idx in perm_batches(x.shape[0], bs, e):
            y = x[idx]
            yield torch.from_numpy(y.indptr), torch.from_numpy(y.indices), torch.from_numpy(y.data)

    return it


@dataclass
class Stream:
    """One method: a stream of batches that lives across its windows."""

    name: str
    make: Callable[[], Iterator[Any]]
    params: dict[str, Any]
    baseline: str | None = None  # the method its ratio is taken against
    windows: list[float] = field(default_factory=list)  # rows/s per window
    it: Iterator[Any] | None = None
    loader: Any = None

    def start(self, warmup: int) -> float:
        t0 = time.perf_counter()
        self.it = self.make()
        for _ in range(1 + warmup):
            next(self.it)
        return time.perf_counter() - t0

    def window(self, seconds: float) -> float:
        assert self.it is not None
        rows = 0
        t0 = time.perf_counter()
        while True:
            rows += rows_of(next(self.it))
            dt = time.perf_counter() - t0
            if dt >= seconds:
                break
        self.windows.append(rows / dt)
        return rows / dt


def decoder_cpu(root: psutil.Process) -> float:
    """CPU seconds of the decoder processes under ``root`` (``python -m loaders.engine.decoder``)."""
    total = 0.0
    try:
        procs = root.children(recursive=True)
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            if "loaders.engine.decoder" in " ".join(p.cmdline()):
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
    return total


def hwm_mib(root: psutil.Process) -> float:
    """Sum of the kernel's peak-RSS marks (``VmHWM``) of the process tree."""
    total = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total / MIB


def loader_stream(
    root: str,
    sample: str,
    bs: int,
    workers: int,
    densify: bool,
    window: int,
    torch_sparse: bool = False,
) -> tuple[Callable[[], Iterator[Any]], Any]:
    from loaders import ShardDataset, ShardLoader

    kw: dict[str, Any] = {"densify": densify, "window": window, "torch_sparse": torch_sparse}
    ds = ShardDataset(root, split="train", sample=sample, batch_size=bs, shuffle=True, seed=0, **kw)
    dl = ShardLoader(ds, num_workers=workers, persistent_workers=workers > 0)

    def epoch(e: int) -> Iterator[Any]:
        dl.set_epoch(e)
        return iter(dl)

    return (lambda: EpochChain(epoch)), dl


def run_interleaved(spec: dict[str, Any]) -> dict[str, Any]:
    """Spec: h5ad, shards_root, batch_size, seconds (per window), rounds, warmup, workers (list),
    windows (shuffle windows to measure, in shards), sparse (bool)."""

    x = load_csr(spec["h5ad"])
    bs, root = int(spec["batch_size"]), spec["shards_root"]
    streams = [
        Stream(
            "scipy X[idx].toarray()", lambda: EpochChain(scipy_dense(x, bs)), {"kind": "baseline"}
        ),
        Stream("scipy X[idx]", lambda: EpochChain(scipy_sparse(x, bs)), {"kind": "baseline"}),
    ]
    for window in spec.get("windows", [4]):
        for w in spec.get("workers", [0]):
            for densify in (True, False) if spec.get("sparse", True) else (True,):
                make, dl = loader_stream(root, "cells", bs, w, densify, window)
                name = f"shards cells {'dense' if densify else 'sparse'} (w={w}, window={window})"
                s = Stream(
                    name,
                    make,
                    {"kind": "loader", "num_workers": w, "densify": densify, "window": window},
                    baseline=streams[0].name if densify else streams[1].name,
                )
                s.loader = dl
                streams.append(s)
    me = psutil.Process(os.getpid())
    rss_between: list[float] = []
    ttfb = {s.name: s.start(int(spec.get("warmup", 5))) for s in streams}
    cpu0 = decoder_cpu(me)
    epochs0 = {s.name: getattr(s.it, "epochs", 0) for s in streams}
    decode: dict[str, float] = {s.name: 0.0 for s in streams}
    for _ in range(int(spec["rounds"])):
        for s in streams:
            c0 = decoder_cpu(me)
            s.window(float(spec["seconds"]))
            decode[s.name] += decoder_cpu(me) - c0
            rss_between.append(tree_rss(me) / MIB)
    results = []
    by_name = {s.name: s for s in streams}
    for s in streams:
        epochs = getattr(s.it, "epochs", 0) - epochs0[s.name]
        row: dict[str, Any] = {
            "method": s.name,
            "params": s.params,
            "cells_per_s": statistics.median(s.windows),
            "windows": s.windows,
            "ttfb_s": ttfb[s.name],
            "epochs": epochs,
            "decode_cpu_s_per_epoch": decode[s.name] / epochs if epochs else None,
        }
        if s.baseline is not None:
            base = by_name[s.baseline]
            ratios = [a / b for a, b in zip(s.windows, base.windows, strict=True)]
            row.update(baseline=s.baseline, ratio=statistics.median(ratios), ratios=ratios)
        results.append(row)
    for s in streams:
        close = getattr(s.it, "close", None)
        if close is not None:
            close()
    return {
        "results": results,
        "rss_between_windows_mib": max(rss_between, default=0.0),
        "hwm_sum_mib": hwm_mib(me),
        "decoder_cpu_s": decoder_cpu(me) - cpu0,
        "rounds": int(spec["rounds"]),
        "seconds": float(spec["seconds"]),
    }


def run_workers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Decode CPU-seconds per epoch and peak window memory for each ``num_workers``
    (``workers_scan``), dense cells, ``scan_window`` shards a window (so every epoch decodes),
    persistent workers: one warm-up epoch, then ``scan_epochs`` measured. Window memory: the most
    bytes of decoder slabs alive at once (the windows the rank holds; workers map the same slabs)
    plus what workers decoded themselves (none with the broker)."""
    from loaders import ShardDataset, ShardLoader

    out = []
    for w in spec.get("workers_scan", [0, 1, 2, 4]):
        ds = ShardDataset(
            spec["shards_root"],
            split="train",
            sample="cells",
            batch_size=int(spec["batch_size"]),
            window=int(spec.get("scan_window", 2)),
            seed=0,
        )
        dl = ShardLoader(ds, num_workers=w, persistent_workers=w > 0)
        me = psutil.Process(os.getpid())
        dl.set_epoch(0)
        for _ in dl:
            pass
        c0, t0, rows = decoder_cpu(me), time.perf_counter(), 0
        wc0 = _workers_cpu(me)
        epochs = int(spec.get("scan_epochs", 2))
        for e in range(1, 1 + epochs):
            dl.set_epoch(e)
            for b in dl:
                rows += rows_of(b)
        dt = time.perf_counter() - t0
        engine = ds.engine_here()
        dec = engine.decoder_state
        out.append(
            {
                "num_workers": w,
                "cells_per_s": rows / dt,
                "epochs": epochs,
                "decode_cpu_s_per_epoch": (decoder_cpu(me) - c0) / epochs,
                "worker_cpu_s_per_epoch": (_workers_cpu(me) - wc0) / epochs,
                "window_decodes": engine.broker.decodes if engine.broker else None,
                "peak_window_mib": (dec.peak_bytes if dec else 0) / MIB,
            }
        )
        del dl, ds
    return out


def _workers_cpu(root: psutil.Process) -> float:
    """CPU seconds of the DataLoader workers under ``root`` (children that are not decoder
    processes)."""
    total = 0.0
    for p in root.children(recursive=False):
        try:
            if "loaders.engine.decoder" not in " ".join(p.cmdline()):
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
    return total


def main(argv: list[str] | None = None) -> int:
    """The same-process run alone, e.g. for an A/B of a loader change (``make bench`` runs it with
    every other section):

        python -m benchmarks.interleaved --h5ad bench_data/synth_.../part_00.h5ad --shards SHARDS
    """
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument(
        "--h5ad", required=True, help="the source the shards were built from (the scipy baselines)"
    )
    ap.add_argument("--shards", required=True, help="a built dataset folder (index.json + shards/)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--workers", default="0,2", help="comma list of num_workers")
    ap.add_argument("--window", type=int, default=4, help="shuffle window (shards)")
    a = ap.parse_args(argv)
    workers = [int(w) for w in a.workers.split(",")]
    r = run_interleaved(
        {
            "h5ad": a.h5ad,
            "shards_root": a.shards,
            "batch_size": 256,
            "seconds": a.seconds,
            "rounds": a.rounds,
            "warmup": 5,
            "workers": workers,
            "windows": [a.window],
        }
    )
    rows = {x["method"]: x for x in r["results"]}
    for name, row in rows.items():
        extra = f", {row['ratio']:.3f}x {row['baseline']}" if "ratio" in row else ""
        print(f"{name}: {row['cells_per_s']:,.0f} cells/s{extra}")
    for w in workers[1:]:
        for kind in ("dense", "sparse"):
            a_w = rows[f"shards cells {kind} (w={w}, window={a.window})"]["windows"]
            b_w = rows[f"shards cells {kind} (w={workers[0]}, window={a.window})"]["windows"]
            per = [x / y for x, y in zip(a_w, b_w, strict=True)]
            print(
                f"{kind}: w={w} / w={workers[0]} per round {', '.join(f'{x:.2f}' for x in per)}; "
                f"median {statistics.median(per):.3f}"
            )
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
