"""Reading a dataset from object storage through the node cache, against the same folder on local
disk (docs/REMOTE.md, "Measured"; every run so far: docs/REMOTE_MEASURED.md).

    .venv/bin/python -m benchmarks.remote_bench DATASET_DIR [--rounds 3] [--batch-size 256]
        [--window 4] [--epochs-per-round 4]

Starts moto_server on 127.0.0.1, uploads DATASET_DIR, warms both readers (one untimed epoch from
local disk and one that fills the warm cache), then per round, in this one process: epochs from
local disk and on the warm cache, interleaved (A B A B ..., then B A B A ... the next round: a
round's rate is all its cells over all its time), then the
server's raw GET throughput for the split's shard objects (8 concurrent requests, as the cache
downloads: the limit a cold epoch cannot beat) and a cold epoch (a fresh cache folder: every shard
downloaded while the epoch runs). Local and warm epochs are measured identically: same options,
the open untimed, and the earlier epochs' loaders torn down (their decoder processes stopped)
before each epoch starts (``_settle``). Reports medians: rates in cells/s, the ratios the targets
judge as medians of per-round ratios (warm >= 0.95x local; cold >= 0.8x min(local, the GET limit
in cells/s)), the cold epoch's time to first batch, its peak cache bytes and network bytes (shard
bytes the cache downloaded: each object once), and the warm epoch's (0). moto is Python on the
same 2 cores as the loader: its GET rate is the limit here, not a real S3's. Hence also the CPU
seconds per million cells of each epoch kind (this process and its ended children, i.e. the
decoder processes; the server's for the GETs and the cold epoch), and two ceilings on the cold
rate (benchmarks/remote_limits.py): what the machine's cores allow while the server shares them
(`cpu_ceiling`), and what the order of the work allows (`order_ceiling`: a window's batches
wait for all its shards).

Why ``_settle``: a ShardDataset used to sit in reference cycles (fixed since: loaders/engine
produce.py and supply.py, tests/loaders/test_loader_release.py), so an epoch's loader was freed only by
the cyclic GC, at some later allocation; until then its decoder process lived (and used CPU).
Opening a URL dataset creates an S3 client (many allocations), so the GC ran in the warm epoch's
untimed open, while a local open allocates little and the earlier loaders' processes ran, or
were stopped, inside the timed local epoch: warm read 1.3-8x "faster" than the same files on
local disk.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.remote_limits import (
    children_cpu_seconds,
    cpu_figures,
    cpu_seconds,
    order_figures,
)

SPLIT, WINDOW, BUCKET = "train", 4, "bench"
# local and warm epochs per round, alternating (A B A B ...). Why several: a single epoch of a
# one-window split moves ~2x here (fresh huge pages for its window: docs/REMOTE_MEASURED.md), and
# five rounds of one epoch each left 23a's median between 0.68 and 1.08 from run to run.
EPOCHS_PER_ROUND = 4


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """moto_server on a free port of 127.0.0.1, answering; (process, endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("moto_server")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
    proc = subprocess.Popen(
        [*cmd, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            return proc, endpoint
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.1)


def _env(endpoint: str) -> None:
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )


def upload(root: Path, url: str) -> None:
    from pipeline.push import push  # import weight: the store's client, only this section

    push(root, url, progress=False)


def raw_get(url: str, keys: list[str], tmp: Path, server_pid: int) -> dict[str, float]:
    """MB/s of GETting every key (8 at a time, to files: what the cache does), and the cores the
    server and this client kept busy meanwhile (CPU seconds / wall seconds): what a cold epoch
    shares the machine's cores with besides its decode."""
    from loaders.remote.cache import THREADS  # import weight: the S3 client, only this section
    from loaders.remote.store import open_store  # import weight: as the line above

    store = open_store(url)
    server0, client0, t0 = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        total = sum(pool.map(lambda k: store.get_to_file(k, tmp / k.replace("/", "_")), keys))
    dt = time.perf_counter() - t0
    server, client = cpu_seconds(server_pid) - server0, time.process_time() - client0
    for p in tmp.iterdir():
        p.unlink()
    return {
        "mb_s": total / dt / 1e6,
        "server_cores": server / dt,
        "client_cores": client / dt,
        "cpu_s": server + client,
    }


def _settle() -> None:
    """Free the earlier epochs' loaders now, untimed (a dataset whose decode ahead was still
    running when it was dropped goes a moment later), and their finalizers stop their decoder
    processes; kept although datasets no longer sit in reference cycles."""
    gc.collect()


def epoch(
    root: str | Path,
    batch_size: int,
    window: int = WINDOW,
    server_pid: int | None = None,
    **kw: Any,
) -> dict[str, float]:
    """One epoch of ``cells`` batches in the training process (default engine: decoder
    process); open, first batch and whole-epoch times. Earlier loaders are torn down before it
    starts and this one after it ends (``_settle``), outside the times."""
    from loaders import ShardDataset, ShardLoader  # import weight: torch, only when measuring

    _settle()
    t0 = time.perf_counter()
    ds = ShardDataset(root, split=SPLIT, batch_size=batch_size, window=window, seed=0, **kw)
    kids0 = children_cpu_seconds()
    server0 = cpu_seconds(server_pid) if server_pid else 0.0
    me0, t1 = time.process_time(), time.perf_counter()
    n, first, b = 0, None, None
    for b in ShardLoader(ds):
        n += int(next(iter(b.values())).shape[0])
        first = first if first is not None else time.perf_counter() - t1
    dt = time.perf_counter() - t1
    me = time.process_time() - me0
    server = cpu_seconds(server_pid) - server0 if server_pid else 0.0
    del ds, b
    _settle()
    out = {
        "open_s": t1 - t0,
        "first_batch_s": float(first or 0),
        "epoch_s": dt,
        "serve_s": dt - float(first or 0),  # from the first batch to the last
        "cells": n,
        # CPU of the timed epoch, as its rate: this process's over epoch_s, plus its decoder
        # process's (known once it has ended, at the teardown: its start and its decode)
        "cpu_s": me + children_cpu_seconds() - kids0,
    }
    if server_pid:
        out["server_cpu_s"] = server  # the server's over epoch_s
    return out


def merge_epochs(epochs: list[dict[str, float]]) -> dict[str, float]:
    """One round's local (or warm) epochs as one: the mean epoch time and CPU (so cells / epoch_s
    is the round's rate: all its cells over all its time), the first epoch's open and first
    batch."""
    return {
        "open_s": epochs[0]["open_s"],
        "first_batch_s": epochs[0]["first_batch_s"],
        "epoch_s": statistics.fmean(x["epoch_s"] for x in epochs),
        "serve_s": statistics.fmean(x["serve_s"] for x in epochs),
        "cells": epochs[0]["cells"],
        "cpu_s": statistics.fmean(x["cpu_s"] for x in epochs),
        "epochs": len(epochs),
    }


def run_remote_bench(
    root: Path,
    rounds: int = 3,
    batch_size: int = 256,
    window: int = WINDOW,
    epochs_per_round: int = EPOCHS_PER_ROUND,
) -> dict[str, Any]:
    from loaders.format import read_index  # import weight: the loader, only when measuring
    from loaders.remote.ledger import cache_bytes  # import weight: as the line above

    proc, endpoint = start_moto()
    _env(endpoint)
    work = Path(tempfile.mkdtemp(prefix="remote-bench-"))
    try:
        import boto3  # import weight: botocore, only to create the bucket

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        url = f"s3://{BUCKET}/ds"
        upload(root, url)
        index = read_index(root)
        entries = index.shards_of(SPLIT)
        shard_bytes = sum(e.bytes for e in entries)
        if index.encoding == "zarr":
            keys = [
                f"shards/{p.relative_to(root / 'shards').as_posix()}"
                for e in entries
                for p in sorted((root / "shards" / e.file).rglob("*"))
                if p.is_file()
            ]
        else:
            keys = [f"shards/{e.file}" for e in entries]
        (work / "get").mkdir()
        warm = work / "warm"
        load_start = list(os.getloadavg())
        epoch(url, batch_size, window, cache_dir=warm)  # fill the warm cache (and the page cache)
        epoch(root, batch_size, window)  # local disk warmed the same way: one untimed epoch
        runs: dict[str, list[dict[str, float]]] = {"local": [], "warm": [], "cold": []}
        gets: list[dict[str, float]] = []
        peak: list[int] = []
        for r in range(rounds):
            pair = ["local", "warm"] if r % 2 == 0 else ["warm", "local"]
            held: dict[str, list[dict[str, float]]] = {"local": [], "warm": []}
            for _ in range(epochs_per_round):  # A B A B ...: each pair meets the same drift
                for what in pair:
                    where, kw = (root, {}) if what == "local" else (url, {"cache_dir": warm})
                    held[what].append(epoch(where, batch_size, window, **kw))
            for what in pair:
                runs[what].append(merge_epochs(held[what]))
            for what in ["get", "cold"] if r % 2 == 0 else ["cold", "get"]:
                if what == "get":
                    gets.append(raw_get(url, keys, work / "get", proc.pid))
                else:
                    cold = work / f"cold{r}"
                    runs["cold"].append(epoch(url, batch_size, window, proc.pid, cache_dir=cold))
                    peak.append(cache_bytes(cold))
                    shutil.rmtree(cold, ignore_errors=True)
        cells = runs["local"][0]["cells"]
        per = {k: [cells / x["epoch_s"] for x in v] for k, v in runs.items()}  # rates, by round
        rate = {k: statistics.median(v) for k, v in per.items()}
        get_mb_s = statistics.median(g["mb_s"] for g in gets)
        limits = [g["mb_s"] * 1e6 * cells / max(1, shard_bytes) for g in gets]
        limit_cells = statistics.median(limits)
        warm_local = [w / lo for w, lo in zip(per["warm"], per["local"], strict=True)]
        cold_bound = [
            c / min(lo, lim) for c, lo, lim in zip(per["cold"], per["local"], limits, strict=True)
        ]
        warm_over_local, cold_over_bound = (
            statistics.median(warm_local),
            statistics.median(cold_bound),
        )
        cpu = cpu_figures(runs, gets, cells, min(rate["local"], limit_cells))
        windows = -(-len(entries) // max(1, window))  # this one rank reads them all
        out = {
            "setup": f"{root.name}: {len(entries)} {index.encoding} shards of {SPLIT}, "
            f"{shard_bytes / 1e6:.1f} MB, {cells} cells; window {window}, batch {batch_size}; "
            f"moto_server on 127.0.0.1; both warmed; {rounds} rounds of {epochs_per_round} local "
            "and warm epochs interleaved (A B A B ..., B A B A ... the next round), then a raw GET "
            "and a cold epoch; loaders torn down between epochs; rates: medians of the rounds' "
            "rates, ratios: medians of per-round ratios",
            "raw_get_MB_s": round(get_mb_s, 1),
            # cores busy during the raw GETs (medians): the server's and the client's
            "raw_get_server_cores": round(statistics.median(g["server_cores"] for g in gets), 2),
            "raw_get_client_cores": round(statistics.median(g["client_cores"] for g in gets), 2),
            "raw_get_limit_cells_s": round(limit_cells),
            "cells_per_s": {k: round(v) for k, v in rate.items()},
            "cells_per_s_by_round": {k: [round(x) for x in v] for k, v in per.items()},
            "warm_over_local": round(warm_over_local, 3),
            "warm_over_local_by_round": [round(x, 3) for x in warm_local],
            "cold_over_bound": round(cold_over_bound, 3),
            "targets": {  # docs/REMOTE.md, "Measured"
                "warm >= 0.95x local": warm_over_local >= 0.95,
                "cold >= 0.8x min(local, GET limit)": cold_over_bound >= 0.8,
            },
            "cold_first_batch_s": round(
                statistics.median(x["open_s"] + x["first_batch_s"] for x in runs["cold"]), 3
            ),
            "local_first_batch_s": round(
                statistics.median(x["open_s"] + x["first_batch_s"] for x in runs["local"]), 3
            ),
            "cold_peak_cache_bytes": max(peak),
            "cold_network_bytes_per_epoch": max(peak),  # every shard object, downloaded once
            "warm_network_bytes_per_epoch": 0,
            **cpu,
            **order_figures(
                cells, limits, per["local"], [x["serve_s"] for x in runs["local"]], windows
            ),
            "load_avg_start": load_start,
            "load_avg": list(os.getloadavg()),
        }
        return out
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def remote_section(
    cfg: Any, roots: dict[str, Path], skip: set[str], notes: list[str]
) -> dict[str, Any]:
    """`make bench`'s remote figures, over the run's main zarr build (benchmarks/run.py)."""
    if "remote" in skip:
        return {"skipped": "--skip remote"}
    root = next(iter(roots.values()), None)
    if root is None:
        return {"skipped": "no built dataset (the pipeline section did not run)"}
    print("[bench] remote (moto S3 + node cache)", flush=True)
    try:
        res = run_remote_bench(
            root, rounds=5 if cfg.mode == "full" else 2, batch_size=cfg.batch_size
        )
    except Exception as e:  # report what broke; the rest of the run stands
        notes.append(f"remote not measured: {type(e).__name__}: {e}")
        return {"skipped": f"{type(e).__name__}: {e}"}
    print(f"[remote] {json.dumps(res)}", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="a built dataset folder")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--window", type=int, default=WINDOW, help="shards decoded together")
    ap.add_argument(
        "--epochs-per-round",
        type=int,
        default=EPOCHS_PER_ROUND,
        help="local and warm epochs per round, alternating",
    )
    a = ap.parse_args(argv)
    res = run_remote_bench(a.root.resolve(), a.rounds, a.batch_size, a.window, a.epochs_per_round)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
