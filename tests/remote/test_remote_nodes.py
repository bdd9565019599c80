"""Two simulated nodes (two cache folders) of a gloo world of 4 ranks, 2 per node, streaming one
S3 dataset: every sample exactly once per epoch, equal batch counts, and each node downloads only
the shards its own ranks read (docs/REMOTE.md, "What each process downloads")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from loaders import ShardDataset, ShardLoader
from loaders.remote.ahead import PREFETCH_WINDOWS, rank_windows

pytestmark = [pytest.mark.process, pytest.mark.s3]  # an S3 server (SeaweedFS); gloo ranks

DEADLINE = 240.0  # 4 spawned ranks import torch on a small, shared machine
WORLD, PER_NODE = 4, 2
KW: dict[str, Any] = {"split": "train", "batch_size": 16, "window": 1, "seed": 11, "pad": False}


def _rank_main(rank: int, world: int, port: int, url: str, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    try:
        node = rank // PER_NODE
        ds = ShardDataset(url, cache_dir=Path(out) / f"node{node}", **KW)
        dl = ShardLoader(ds, timeout=120)
        ids = []
        for batch in dl:
            ids.append(batch["sample_id"].numpy())
            dist.all_reduce(torch.ones(1))  # a training step: ranks with unequal counts would hang
        np.save(Path(out) / f"ids-{rank}.npy", np.concatenate(ids))
        np.save(Path(out) / f"steps-{rank}.npy", np.array([len(ids), len(dl)]))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def many_shards(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("nodes"), "shards", n_shards=16, cells=40, genes=20, seed=4
    )


def test_two_nodes_four_ranks_read_each_sample_once(
    many_shards: Any,
    s3_proxy: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    gloo_world: Callable[..., None],
) -> None:
    url = upload(many_shards.root, f"{s3_bucket}/ds")
    gloo_world(_rank_main, WORLD, url, str(tmp_path), deadline=DEADLINE)
    ids = [np.load(tmp_path / f"ids-{r}.npy") for r in range(WORLD)]
    steps = [np.load(tmp_path / f"steps-{r}.npy").tolist() for r in range(WORLD)]
    assert len({tuple(s) for s in steps}) == 1 and steps[0][0] == steps[0][1] > 0
    every = np.concatenate(ids)
    local = ShardDataset(many_shards.root, **KW)
    assert np.unique(every).size == every.size == local.n_units // WORLD * WORLD
    gets = s3_proxy.gets()
    for node in range(WORLD // PER_NODE):
        got = {p.name for p in (tmp_path / f"node{node}").glob("*/*/shards/*")}
        ranks = [
            ShardDataset(many_shards.root, rank=r, world_size=WORLD, **KW)
            for r in range(node * PER_NODE, (node + 1) * PER_NODE)
        ]
        read, allowed = set(), set()
        for ds in ranks:
            # epoch 0, then the next epoch's first windows (prefetched, and decoded ahead, at its
            # end: what this rank reads next)
            ahead = [(1, w) for w in rank_windows(ds, 1)[: PREFETCH_WINDOWS + 1]]
            for e, w in [(0, w) for w in rank_windows(ds, 0)] + ahead:
                shards = {ds.entries[s].file for s in ds.reader.window_shards(e, w).tolist()}
                (read if e == 0 else allowed).update(shards)
        allowed |= read
        assert read <= got <= allowed, (node, sorted(got - allowed), sorted(read - got))
        assert len(got) < len(local.entries)  # a node never fetched the whole dataset
    assert gets and max(gets.values()) <= WORLD // PER_NODE  # at most once per node
