"""Which shards a process of a remote dataset downloads ahead: this rank's next windows, in the
order it reads them (the rest of this epoch, then the next epoch's first ones), and the cache
space those windows in flight need (checked against ``cache_limit`` at open).

Why this rank's windows only: a rank reads its own slice of the global order (its batch plan,
:mod:`loaders.epoch.order`), which covers a few windows of each epoch; prefetching only those means each
node downloads only the shards its ranks read (docs/REMOTE.md, "What each process downloads").
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np

from loaders.epoch import order
from loaders.format.zarr_reader import warm_zarr
from loaders.remote.resolve import node_cache

PREFETCH_WINDOWS = 2  # windows fetched ahead of the one being read


def rank_windows(ds: Any, epoch: int) -> list[int]:
    """The windows ``ds``'s rank reads in ``epoch``, in order of first use: from its batch plans
    (``ds._plans``, whatever layout the epoch has), computed once per epoch and process."""
    key = (epoch, ds.layout(epoch) if hasattr(ds, "layout") else None)
    known: dict[Any, list[int]] = ds.__dict__.setdefault("_remote_windows", {})
    if key not in known:
        wstarts = order.window_bounds(ds.counts, ds.seed, epoch, ds.window, ds.shuffle)[1]
        plan_of = ds._plans(epoch, wstarts)
        wins = dict.fromkeys(w for j in range(ds.num_batches(epoch)) for w in plan_of(j)[1])
        while len(known) >= 4:  # a few epochs' sequences, kept with the dataset
            known.pop(next(iter(known)))
        known[key] = list(wins)
    return known[key]


def upcoming(ds: Any, epoch: int, w: int, depth: int = PREFETCH_WINDOWS) -> list[tuple[int, int]]:
    """``(epoch, window)`` of window ``w`` and the ``depth`` windows this rank reads after it."""
    wins = rank_windows(ds, epoch)
    after = wins[wins.index(w) + 1 :] if w in wins else []
    out = [(epoch, w)] + [(epoch, x) for x in after[:depth]]
    if len(out) <= depth:  # at the epoch's end: the next epoch's first windows
        out += [(epoch + 1, x) for x in rank_windows(ds, epoch + 1)[: depth + 1 - len(out)]]
    return out


def prefetch(ds: Any, cache: Any, epoch: int, w: int) -> None:
    """Pin window ``w`` and download it and the next windows of this rank in the background."""
    windows = [
        [ds.entries[s] for s in ds.reader.window_shards(e, x).tolist()]
        for e, x in upcoming(ds, epoch, w)
    ]
    if ds.__dict__.get("_remote_release") is not cache:  # once per dataset and process
        ds.__dict__["_remote_release"] = cache
        weakref.finalize(ds, cache.release, id(ds))  # dropped: its read-ahead stops
    cache.prefetch(windows, owner=id(ds))


def at_open(ds: Any) -> None:
    """Start downloading the first windows this rank reads (in its current epoch), in the
    background, when the dataset is opened: the downloads overlap what the trainer does between
    the open and its first batch (building the model, moving it to the device, starting
    DataLoader workers), instead of starting with the first batch. ``SHARDSMITH_PREFETCH_AT_OPEN=0``
    turns it off (an A/B switch for the shaped-link bench)."""
    if os.environ.get("SHARDSMITH_PREFETCH_AT_OPEN", "1") == "0":
        return
    if ds.encoding == "zarr":  # its import too, which would come after the window's last byte
        warm_zarr()
    remote, epoch = ds.reader.spec["remote"], ds.plan.epoch
    wins = rank_windows(ds, epoch)
    if wins:
        prefetch(ds, node_cache(remote, ds.reader.spec["root"]), epoch, wins[0])


def in_flight_bytes(
    sizes: list[int], window: int, depth: int = PREFETCH_WINDOWS, workers: int = 0
) -> int:
    """An upper bound on the bytes of the windows one process keeps in flight (the one read and
    ``depth`` ahead), times the reading processes of a rank (its DataLoader ``workers``, each
    pinning windows of its own; the rank itself when there are none), times the ranks on this
    node (``LOCAL_WORLD_SIZE``, as torchrun sets it)."""
    largest = np.sort(np.asarray(sizes, np.int64))[::-1][: (depth + 1) * window]
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return int(largest.sum()) * max(1, local) * max(1, workers)


def check_limit(
    limit: int | None, url: str, sizes: list[int], window: int, workers: int = 0
) -> None:
    """A limit that cannot hold the windows in flight is refused (it would otherwise wait on its
    own pins, then fail after a minute): at open for one reading process per rank, and again by
    ``ShardLoader`` for its ``num_workers``."""
    if limit is None:
        return
    need = in_flight_bytes(sizes, window, workers=workers)
    if limit < need:
        readers = f"num_workers={workers}, " if workers > 1 else ""
        raise ValueError(
            f"cache_limit={limit} for {url} is smaller than the windows in flight on this node "
            f"({need} bytes: {PREFETCH_WINDOWS + 1} windows of {window} of its largest shards per "
            f"reading process, {readers}LOCAL_WORLD_SIZE="
            f"{os.environ.get('LOCAL_WORLD_SIZE', '1')}): raise cache_limit to at least {need}, "
            "or read with a smaller window or fewer workers"
        )
