"""The engine, chosen on measurement (issue 49 item 3): today's decoder process (each window
decoded once per rank in a torch-free process, DataLoader workers mapping its slabs through the
broker) against the simpler design that needs no IPC: every process decodes the windows its
batches read itself, the shard bytes shared through the node's page cache (Mosaic's way; here
``decode_process=False``). Both keep what matters for the order: batches are dealt round-robin, so
the batches a rank yields do not depend on ``num_workers`` (exact resume across worker counts) and
no worker idles when windows < workers; what the simpler design gives up is window memory, which
grows with the workers (each holds its windows).

    python -m benchmarks.engine_choice SHARDS_ROOT [--workers 0,1,2] [--seconds 2] [--rounds 5]
        [--devices host] [--memory-epochs 2] [--out engine.json]

Two measurements, each printed as a markdown table and written to ``--out`` as JSON:

* **speed**: for each ``num_workers``, the streams (engine x dense/sparse x device) of ONE process
  take turns, one window of ``seconds`` each, ``rounds`` rounds (:mod:`benchmarks.interleaved`'s
  streams; epochs chained, persistent workers); a stream's figure is the median of its windows, a
  ratio the median over rounds of (simpler / decoder process) in the same round.
* **memory**: each configuration alone in a fresh process (``--memory-one``), ``memory_epochs``
  epochs, the process tree sampled every 50 ms: peak PSS (shared pages split among the processes
  mapping them: the node's memory) and peak summed RSS (shared pages counted once per process).

``--devices host,cuda`` adds ``device="cuda"`` streams (the GPU run: ``benchmarks.device_check``
part ``engine``), whose ratio to the host stream of the same engine and W is reported too.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

from benchmarks.interleaved import Stream, rows_of
from benchmarks.measure import MIB, EpochChain

ENGINES: dict[str, dict[str, Any]] = {
    "decoder process": {"decode_process": True},
    "per-process decode": {"decode_process": False},
}
SIMPLER, TODAY = "per-process decode", "decoder process"


def loader(
    root: str, engine: str, workers: int, densify: bool, window: int, device: str | None = None
) -> Any:
    """A ShardLoader over the bench's cells, ``engine`` one of :data:`ENGINES`."""
    from loaders import ShardDataset, ShardLoader

    ds = ShardDataset(
        root, split="train", sample="cells", batch_size=256, seed=0, window=window,
        densify=densify, **ENGINES[engine],
    )  # fmt: skip
    return ShardLoader(ds, num_workers=workers, persistent_workers=workers > 0, device=device)


def _stream(name: str, dl: Any, params: dict[str, Any]) -> Stream:
    def epoch(e: int) -> Any:
        dl.set_epoch(e)
        return iter(dl)

    s = Stream(name, lambda: EpochChain(epoch), params)
    s.loader = dl
    return s


def speed(
    root: str,
    workers: list[int],
    window: int,
    seconds: float,
    rounds: int,
    devices: list[str],
) -> list[dict[str, Any]]:
    """Cells/s per (engine, W, dense/sparse, device), interleaved per W (see module docstring)."""
    out: list[dict[str, Any]] = []
    for w in workers:
        streams = []
        for engine in ENGINES:
            for densify in (True, False):
                for dev in devices:
                    name = f"{engine} W={w} {'dense' if densify else 'sparse'} {dev}"
                    dl = loader(root, engine, w, densify, window, None if dev == "host" else dev)
                    params = {"engine": engine, "workers": w, "densify": densify, "device": dev}
                    streams.append(_stream(name, dl, params))
        for s in streams:
            s.start(warmup=5)
        for _ in range(rounds):
            for s in streams:
                s.window(seconds)
        by = {(s.params["engine"], s.params["densify"], s.params["device"]): s for s in streams}
        for s in streams:
            p = s.params
            row: dict[str, Any] = {**p, "cells_per_s": statistics.median(s.windows)}
            today = by[(TODAY, p["densify"], p["device"])]
            row["vs_decoder_process"] = statistics.median(
                a / b for a, b in zip(s.windows, today.windows, strict=True)
            )
            host = by[(p["engine"], p["densify"], "host")]
            row["vs_host"] = statistics.median(
                a / b for a, b in zip(s.windows, host.windows, strict=True)
            )
            out.append(row)
            print(f"[engine] {s.name}: {row['cells_per_s']:,.0f} cells/s", flush=True)
        for s in streams:
            close = getattr(s.it, "close", None)
            if close is not None:
                close()
        del streams, by
        gc.collect()
    return out


def _tree(me: psutil.Process) -> list[psutil.Process]:
    try:
        return [me, *me.children(recursive=True)]
    except psutil.Error:
        return [me]


def _sample(me: psutil.Process, peak: dict[str, float], stop: threading.Event) -> None:
    while not stop.wait(0.05):
        pss = rss = 0
        for p in _tree(me):
            try:
                m = p.memory_full_info()
                pss, rss = pss + m.pss, rss + m.rss
            except psutil.Error:
                pass
        peak["pss"], peak["rss"] = max(peak["pss"], pss), max(peak["rss"], rss)


def memory_one(
    root: str, engine: str, workers: int, densify: bool, window: int, epochs: int
) -> dict[str, Any]:
    """One configuration's peak memory over ``epochs`` epochs, in this (fresh) process."""
    dl = loader(root, engine, workers, densify, window)
    me, peak, stop = psutil.Process(os.getpid()), {"pss": 0.0, "rss": 0.0}, threading.Event()
    sampler = threading.Thread(target=_sample, args=(me, peak, stop), daemon=True)
    sampler.start()
    rows, t0 = 0, time.perf_counter()
    for e in range(epochs):
        dl.set_epoch(e)
        for b in dl:
            rows += rows_of(b)
    dt = time.perf_counter() - t0
    stop.set()
    sampler.join()
    return {
        "engine": engine, "workers": workers, "densify": densify,
        "peak_pss_mib": peak["pss"] / MIB, "peak_rss_sum_mib": peak["rss"] / MIB,
        "cells_per_s_alone": rows / dt,
    }  # fmt: skip


def memory(root: str, workers: list[int], window: int, epochs: int) -> list[dict[str, Any]]:
    """:func:`memory_one` for every configuration, each in a fresh process, engines alternated."""
    out = []
    for w in workers:
        for densify in (True, False):
            for engine in ENGINES:
                args = [sys.executable, "-m", "benchmarks.engine_choice", root, "--memory-one",
                        json.dumps([engine, w, densify, window, epochs])]  # fmt: skip
                r = subprocess.run(args, capture_output=True, text=True, check=True)
                out.append(json.loads(r.stdout.strip().splitlines()[-1]))
                print(f"[engine] memory {out[-1]}", flush=True)
    return out


def table(speeds: list[dict[str, Any]], mems: list[dict[str, Any]]) -> str:
    """Markdown: one row per (W, dense/sparse, device), the two engines side by side."""
    mem = {(m["engine"], m["workers"], m["densify"]): m for m in mems}
    lines = [
        "| W | batches | device | decoder process cells/s | per-process cells/s | ratio "
        "| decoder process peak PSS / RSS MiB | per-process peak PSS / RSS MiB | vs host (decoder, per-process) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = {(r["engine"], r["workers"], r["densify"], r["device"]): r for r in speeds}
    for w, densify, dev in sorted({(r["workers"], not r["densify"], r["device"]) for r in speeds}):
        densify = not densify
        a, b = rows[(TODAY, w, densify, dev)], rows[(SIMPLER, w, densify, dev)]
        ma, mb = mem.get((TODAY, w, densify)), mem.get((SIMPLER, w, densify))

        def m(x: dict[str, Any] | None) -> str:
            return "-" if x is None else f"{x['peak_pss_mib']:.0f} / {x['peak_rss_sum_mib']:.0f}"

        lines.append(
            f"| {w} | {'dense' if densify else 'sparse'} | {dev} | {a['cells_per_s']:,.0f} "
            f"| {b['cells_per_s']:,.0f} | {b['vs_decoder_process']:.2f} | {m(ma)} | {m(mb)} "
            f"| {a['vs_host']:.2f}, {b['vs_host']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="a built cells dataset (index.json + shards/)")
    ap.add_argument("--workers", default="0,1,2")
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--devices", default="host", help="comma list: host, cuda")
    ap.add_argument("--memory-epochs", type=int, default=2, help="0: no memory runs")
    ap.add_argument("--out", default=None)
    ap.add_argument("--memory-one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.memory_one is not None:
        print(json.dumps(memory_one(a.root, *json.loads(a.memory_one))))
        return 0
    workers = [int(w) for w in a.workers.split(",")]
    speeds = speed(a.root, workers, a.window, a.seconds, a.rounds, a.devices.split(","))
    mems = memory(a.root, workers, a.window, a.memory_epochs) if a.memory_epochs else []
    result = {"speed": speeds, "memory": mems, "load": os.getloadavg(), "cores": os.cpu_count()}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(table(speeds, mems))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
