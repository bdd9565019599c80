"""Streaming a dataset over a link that is the limit: SeaweedFS in its own network namespace behind
a veth pair shaped with tc tbf (benchmarks/shaped_link.py), read through the node cache
(docs/REMOTE.md, "Measured on a shaped link"; issue 46).

    python -m benchmarks.remote_link_bench [DATASET_DIR] [--rounds 3] [--rate-mbit 100]
        [--window 2] [--cells 200000] [--shard-mb 16] [--format zarr]

Needs root (``ip netns``, ``tc``); otherwise it says why and exits 0 (``make bench`` records the
reason as the section's skip). Without DATASET_DIR it builds a synthetic screen (benchmarks.synth,
``--cells``, blosc-lz4, ``--shard-mb``, ``--format``) under bench_data/. Per round, in this one process:
the raw GET rate of the split's objects over the link (8 concurrent GETs, as the cache downloads:
the bound), a cold epoch (fresh cache, no limit), and three epochs of one dataset on a cache
bounded to 40% of the split's bytes (the first one cold; each later one streams again). Reports, medians of the rounds: the link bound in cells/s
(split cells / (split bytes / raw GET rate)), each epoch kind's rate over it, time to first batch
(open included) against the first window's bytes at the raw rate, requests made before the first
batch, bytes received over the link per epoch, the bounded cache's peak bytes, and the
``index.json`` GETs of four ranks of one job on this node. An epoch's time counts its open: work
moved into the open is not free. A run of epochs is one dataset and loader, as in training (the
read-ahead of epoch e+1's first windows at the end of epoch e counts in epoch e's link bytes).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.measure import tree_bytes
from benchmarks.remote_bench import raw_get, upload
from benchmarks.shaped_link import RATE_MBIT, Link, LinkUnavailable, shaped_server, why_not

SPLIT, BUCKET, WINDOW, LIMIT_SHARE = "train", "bench", 2, 0.4
# the synthetic screen built when no dataset is given: zarr, ~16 train shards of ~7 MB (objects of
# ~200 kB: the link, not the request rate of two shared cores, bounds their GETs; 40% of the
# split holds the 3 windows of 2 shards in flight)
CELLS, SHARD_MB, ENCODING = 200_000, 16.0, "zarr"
KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}
JOB = {"WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}


class Requests:
    """Every request the stores of this process complete, with its time (``ObjectStore._count``
    is called once per request): how many came before the first batch, which keys."""

    def __init__(self) -> None:
        self.log: list[tuple[float, str]] = []

    @contextmanager
    def counting(self) -> Iterator[Requests]:
        from loaders.remote.store import ObjectStore  # import weight: only when measuring

        orig = ObjectStore._count

        def count(store: Any, op: str, nbytes: int = 0) -> None:
            self.log.append((time.perf_counter(), op))
            orig(store, op, nbytes)

        ObjectStore._count = count  # type: ignore[method-assign]
        try:
            yield self
        finally:
            ObjectStore._count = orig  # type: ignore[method-assign]

    def before(self, t: float) -> int:
        return sum(1 for when, _ in self.log if when <= t)


def epochs(
    url: str, link: Link, cache: Path, batch_size: int, window: int, n: int = 1, **kw: Any
) -> list[dict[str, float]]:
    """``n`` epochs of one dataset and loader, as a trainer runs them (the first one's time counts
    the open): each with the requests before its first batch, the bytes the link carried, and
    (sampled every 20 ms) the cache folder's peak bytes. The dataset is dropped and collected
    after, so its read-ahead never runs into the next measurement."""
    from loaders import ShardDataset, ShardLoader  # import weight: torch, only when measuring

    peak, stop = {"ledger": 0, "disk": 0}, threading.Event()

    def sample() -> None:  # the files every 10th time: a walk of them costs ~6 ms of a core
        n = 0
        while not stop.wait(0.02):
            for k, v in held_bytes(cache, disk=n % 10 == 0).items():
                peak[k] = max(peak[k], v)
            n += 1

    gc.collect()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, reqs = [], Requests()
    with reqs.counting():
        t0 = time.perf_counter()
        ds = ShardDataset(url, split=SPLIT, batch_size=batch_size, window=window, seed=0,
                          cache_dir=cache, **kw)  # fmt: skip
        dl = ShardLoader(ds)
        for e in range(n):
            dl.set_epoch(e)
            rx0, cells, first = link.rx_bytes(), 0, 0.0
            for b in dl:
                cells += int(next(iter(b.values())).shape[0])
                first = first or time.perf_counter()
            t1 = time.perf_counter()
            out.append({"epoch_s": t1 - t0, "cells": cells, "first_batch_s": first - t0,
                        "requests_before_first_batch": reqs.before(first),
                        "link_bytes": link.rx_bytes() - rx0})  # fmt: skip
            reqs.log.clear()
            t0 = t1
    stop.set()
    sampler.join()
    del ds, dl, b
    gc.collect()
    last = held_bytes(cache)
    for x in out:
        x["peak_cache_bytes"] = max(peak["ledger"], last["ledger"])
        x["peak_disk_bytes"] = max(peak["disk"], last["disk"])
    return out


def held_bytes(cache: Path, disk: bool = True) -> dict[str, int]:
    """What the cache folder holds: its ledger's bytes (reserved or cached) and the shards' and
    partial downloads' bytes on disk, read under the folder's lock. Read unlocked, one sample
    mixed the ledger before an eviction with the ledger after the reservation it made room for,
    and saw one shard more than was ever held (47.9 MB against a 43.8 MB limit: the lock-held
    sampler beside it saw 41.1 MB)."""
    from loaders.remote.cache import LOCK, TMP
    from loaders.remote.ledger import cache_bytes, locked

    if not cache.is_dir():
        return {"ledger": 0, "disk": 0}
    with locked(cache / LOCK):  # no eviction meanwhile; what downloads write is reserved
        folders = [p for d in ("shards", TMP) for p in cache.glob(f"*/*/{d}")] if disk else []
        return {"ledger": cache_bytes(cache), "disk": sum(map(tree_bytes, folders)) if disk else 0}


def index_gets_per_node(url: str, cache: Path) -> int:
    """``index.json`` GETs when four ranks of one job open the dataset on this node (the
    launcher's environment, as torchrun sets it)."""
    from loaders import ShardDataset  # import weight: torch, only when measuring

    saved = {k: os.environ.get(k) for k in JOB}
    os.environ.update(JOB)
    try:
        from loaders.remote.store import ObjectStore

        orig_get = ObjectStore.get
        keys: list[str] = []

        def get(store: Any, key: str) -> bytes:
            keys.append(key)
            return orig_get(store, key)

        ObjectStore.get = get  # type: ignore[method-assign]
        try:
            for rank in range(int(JOB["WORLD_SIZE"])):
                ShardDataset(url, split=SPLIT, rank=rank, world_size=4, cache_dir=cache)
        finally:
            ObjectStore.get = orig_get  # type: ignore[method-assign]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return keys.count("index.json")


def first_window_bytes(root: Path, batch_size: int, window: int) -> int:
    """The bytes of the shards the first batch needs: the first window this rank reads."""
    from loaders import ShardDataset
    from loaders.remote.ahead import rank_windows

    ds = ShardDataset(root, split=SPLIT, batch_size=batch_size, window=window, seed=0)
    w = rank_windows(ds, 0)[0]
    return sum(ds.entries[s].bytes for s in ds.reader.window_shards(0, w).tolist())


def _med(xs: list[float]) -> float:
    return float(statistics.median(xs))


def run_link_bench(
    root: Path, rounds: int = 3, batch_size: int = 256, window: int = WINDOW,
    rate_mbit: int = RATE_MBIT,
) -> dict[str, Any]:  # fmt: skip
    from loaders.format import read_index  # import weight: the loader, only when measuring

    index = read_index(root)
    entries = index.shards_of(SPLIT)
    split_bytes = sum(e.bytes for e in entries)
    limit = int(LIMIT_SHARE * split_bytes)
    keys = [f"shards/{p.relative_to(root / 'shards').as_posix()}"
            for e in entries for p in sorted((root / "shards" / e.file).rglob("*")) if p.is_file()
            ] if index.encoding == "zarr" else [f"shards/{e.file}" for e in entries]  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="remote-link-"))
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", *KEYS)}
    try:
        with shaped_server(work / "weed", {**os.environ, **KEYS}, rate_mbit) as link:
            import boto3  # import weight: botocore, only to create the bucket

            os.environ.update({**KEYS, "AWS_ENDPOINT_URL": link.server.endpoint})
            boto3.client("s3", endpoint_url=link.server.endpoint).create_bucket(Bucket=BUCKET)
            url = f"s3://{BUCKET}/ds"
            upload(root, url)
            (work / "get").mkdir()
            gets, cold, bounded = [], [], []
            for r in range(rounds):  # each measurement starts on a quiet link
                link.quiet()
                gets.append(raw_get(url, keys, work / "get", link.server.proc.pid)["mb_s"])
                link.quiet()
                cold += epochs(url, link, work / f"cold{r}", batch_size, window)
                link.quiet()
                kw = {"cache_limit": limit}
                bounded.append(epochs(url, link, work / f"bounded{r}", batch_size, window, 3, **kw))
            link.quiet()
            d = index_gets_per_node(url, work / "ranks")
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        shutil.rmtree(work, ignore_errors=True)
    cells = cold[0]["cells"]
    mb_s = _med(gets)
    bound = mb_s * 1e6 * cells / split_bytes  # cells/s the link allows
    rate = {
        "cold": _med([cells / x["epoch_s"] for x in cold]),
        "bounded_first": _med([cells / x[0]["epoch_s"] for x in bounded]),
        "bounded_later": _med([cells / x["epoch_s"] for xs in bounded for x in xs[1:]]),
    }
    first_bytes = first_window_bytes(root, batch_size, window)
    return {
        "setup": f"{root.name}: {len(entries)} {index.encoding} shards of {SPLIT}, "
        f"{split_bytes / 1e6:.1f} MB, {cells} cells; window {window}, batch {batch_size}; "
        f"SeaweedFS in a network namespace behind a veth shaped to {rate_mbit} Mbit/s (tc tbf); "
        f"{rounds} rounds of: raw GET, a cold epoch, 3 epochs with cache_limit = "
        f"{LIMIT_SHARE:.0%} of the split ({limit / 1e6:.1f} MB); medians",
        "rate_mbit": rate_mbit,
        "raw_get_MB_s": round(mb_s, 2),
        "raw_get_MB_s_by_round": [round(x, 2) for x in gets],
        "link_bound_cells_s": round(bound),
        "cells_per_s": {k: round(v) for k, v in rate.items()},
        "cold_over_link": round(rate["cold"] / bound, 3),
        "cold_over_link_by_round": [round(cells / x["epoch_s"] / bound, 3) for x in cold],
        "bounded_later_over_link": round(rate["bounded_later"] / bound, 3),
        "bounded_first_over_link": round(rate["bounded_first"] / bound, 3),
        "cache_limit_bytes": limit,
        "bounded_peak_cache_bytes": max(x["peak_cache_bytes"] for xs in bounded for x in xs),
        "bounded_peak_disk_bytes": max(x["peak_disk_bytes"] for xs in bounded for x in xs),
        "cold_first_batch_s": round(_med([x["first_batch_s"] for x in cold]), 3),
        "first_window_bytes": first_bytes,
        "first_batch_goal_s": round(first_bytes / (mb_s * 1e6) + 0.5, 3),
        "requests_before_first_batch": round(
            _med([x["requests_before_first_batch"] for x in cold])
        ),
        "link_bytes_per_epoch": {
            "cold": round(_med([x["link_bytes"] for x in cold])),
            "bounded_later": round(_med([x["link_bytes"] for xs in bounded for x in xs[1:]])),
        },
        "split_bytes": split_bytes,
        "index_gets_per_node_4_ranks": d,
        "load_avg": list(os.getloadavg()),
    }


def link_targets(rl: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 46's targets (a)-(d), from the section's results."""
    from benchmarks.verdicts import target

    ok = "link_bound_cells_s" in rl
    why = "" if ok else f"shaped link: {rl.get('skipped') or rl.get('error') or 'not run'}"
    setup = rl.get("setup", "")
    lim = rl.get("cache_limit_bytes", 0)
    peak = max(rl.get("bounded_peak_cache_bytes", 0), rl.get("bounded_peak_disk_bytes", 0))
    return [
        target(
            "46a",
            "shaped link: cold epoch / link bound (split bytes at the raw GET rate) (>= 0.9x)",
            rl.get("cold_over_link") if ok else None,
            0.9,
            True,
            detail=f"{setup}; raw GET {rl.get('raw_get_MB_s')} MB/s = "
            f"{rl.get('link_bound_cells_s', 0):,} cells/s; cold {rl.get('cells_per_s')}"
            if ok
            else why,
        ),  # fmt: skip
        target(
            "46b",
            "shaped link: epochs 2+ with cache_limit = 40% of the split / link bound "
            "(>= 0.9x; cache never above the limit)",
            (rl["bounded_later_over_link"] if peak <= lim else 0.0) if ok else None,
            0.9,
            True,
            detail=f"peak cache {rl.get('bounded_peak_cache_bytes', 0):,} B (ledger), "
            f"{rl.get('bounded_peak_disk_bytes', 0):,} B (on disk), limit {lim:,} B; link bytes per epoch "
            f"{rl.get('link_bytes_per_epoch')}"
            if ok
            else why,
        ),  # fmt: skip
        target(
            "46c",
            "shaped link: cold time to first batch, open included (<= the first "
            "window's bytes at the raw GET rate + 0.5 s)",
            rl.get("cold_first_batch_s") if ok else None,
            rl.get("first_batch_goal_s", 0.5),
            False,
            unit="s",
            detail=f"first window {rl.get('first_window_bytes', 0):,} B; "
            f"{rl.get('requests_before_first_batch')} requests before it"
            if ok
            else why,
        ),  # fmt: skip
        target(
            "46d",
            "shaped link: index.json GETs per node, 4 ranks of one job (<= 1)",
            rl.get("index_gets_per_node_4_ranks") if ok else None,
            1,
            False,
            unit="",
            detail="" if ok else why,
        ),  # fmt: skip
    ]


def build_dataset(cells: int, shard_mb: float, data_dir: Path, encoding: str = ENCODING) -> Path:
    """A synthetic screen (benchmarks.synth) built with shards small enough for many windows (so
    that 40% of the split holds the windows in flight) and large enough that the link bounds the
    raw GETs: a zarr shard is ~30 objects, and at 2 MB per shard (54 kB objects) their request
    rate on two shared cores (5-7 MB/s at load 12) was the bound, not a 100 Mbit link. A tar
    build is one object per shard, but its condition table is stored raw (16 MB of one-hot rows
    for a 30k-cell screen, fetched at open)."""
    from benchmarks.synth import SynthParams, ensure_dataset, write_manifest
    from pipeline.build import build  # import weight: the pipeline, only to build

    data_dir = data_dir.resolve()  # the manifest names its sources relative to its own folder
    ds = ensure_dataset(replace(SynthParams(), n_cells=cells), data_dir)
    out = data_dir / f"link-{ds.params.key()}-{shard_mb}mb-{encoding}"
    if not (out / "index.json").exists():
        manifest = write_manifest(data_dir / f"link-{cells}.toml", ds, name="bench-link",
                                  codec="blosc-lz4", shard_size_mb=shard_mb)  # fmt: skip
        build(manifest, out, jobs=1, progress=False, encoding=encoding)
    return out


def link_section(cfg: Any, data_dir: Path, skip: set[str], notes: list[str]) -> dict[str, Any]:
    """`make bench`'s shaped-link section (benchmarks/run.py): skipped, saying why, where the
    link cannot be set up (not root, no tc)."""
    if "remote_link" in skip:
        return {"skipped": "--skip remote_link"}
    reason = why_not()
    if reason:
        notes.append(f"shaped link not measured: {reason}.")
        return {"skipped": reason}
    full = cfg.mode == "full"
    print("[bench] remote over a shaped link (SeaweedFS, tc tbf)", flush=True)
    try:
        root = build_dataset(*((CELLS, SHARD_MB) if full else (20_000, 2)), data_dir)
        res = run_link_bench(root, rounds=3 if full else 1, batch_size=cfg.batch_size)
    except LinkUnavailable as e:
        notes.append(f"shaped link not measured: {e}.")
        return {"skipped": str(e)}
    except Exception as e:  # report what broke; the rest of the run stands
        notes.append(f"shaped link not measured: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {e}"}
    print(f"[remote_link] {json.dumps(res)}", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, nargs="?", help="a built dataset folder (else synthetic)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--window", type=int, default=WINDOW)
    ap.add_argument("--rate-mbit", type=int, default=RATE_MBIT)
    ap.add_argument("--cells", type=int, default=CELLS)
    ap.add_argument("--shard-mb", type=float, default=SHARD_MB)
    ap.add_argument("--format", choices=["tar", "zarr"], default=ENCODING)
    ap.add_argument("--data-dir", type=Path, default=Path("bench_data"))
    a = ap.parse_args(argv)
    reason = why_not()
    if reason:
        print(f"shaped-link bench skipped: {reason}")
        return 0
    root = a.root.resolve() if a.root else build_dataset(a.cells, a.shard_mb, a.data_dir, a.format)
    try:
        res = run_link_bench(root, a.rounds, a.batch_size, a.window, a.rate_mbit)
    except LinkUnavailable as e:
        print(f"shaped-link bench skipped: {e}")
        return 0
    print(json.dumps(res, indent=1))
    for t in link_targets(res):
        print(f"[target {t['name']}] {t.get('by', t['status'])} - {t['what']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
