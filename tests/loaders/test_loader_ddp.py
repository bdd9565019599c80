"""Multi-rank loading under a real torch.distributed (gloo on 127.0.0.1) with DataLoader workers.

Each rank runs a fake training loop that all-reduces once per batch: if ranks disagreed on the
number of batches, one would block in the collective, so the parent enforces a deadline and fails
the test instead of hanging.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from loaders import ShardDataset, ShardLoader

pytestmark = pytest.mark.process  # gloo ranks with DataLoader workers

DEADLINE = 90.0  # seconds for a whole job (spawning ranks imports torch in each)


def _rank_main(rank: int, world: int, port: int, root: str, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        for pad in (False, True):
            ds = ShardDataset(
                root, split="train", batch_size=24, pad=pad, window=2, seed=7
            )  # rank/world from dist
            assert (ds.rank, ds.world_size) == (rank, world)
            # ranks started by spawn default to spawning their workers too (re-importing torch every
            # epoch); persistent workers start once for both epochs (and must follow set_epoch)
            dl = ShardLoader(
                ds,
                num_workers=2,
                timeout=60,
                multiprocessing_context="fork",
                persistent_workers=True,
            )
            ids, steps = [], 0
            for epoch in range(2):
                dl.set_epoch(epoch)
                for batch in dl:
                    if epoch == 0:
                        ids.append(batch["sample_id"].numpy())
                    step = torch.ones(1)
                    dist.all_reduce(step)  # the "training step": every rank must take part
                    steps += 1
            np.save(Path(out) / f"ids-pad{int(pad)}-rank{rank}.npy", np.concatenate(ids))
            np.save(Path(out) / f"steps-pad{int(pad)}-rank{rank}.npy", np.array([steps, len(dl)]))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _elastic_main(rank: int, world: int, port: int, root: str, out: str) -> None:
    """Part of an epoch on ``world`` ranks with a global batch of 12: resumed from ``state.json``
    when there is one, else 3 steps from the start (then the state of rank 0 is saved)."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        ds = ShardDataset(root, split="train", batch_size=12 // world, window=2, seed=7)
        dl = ShardLoader(ds, num_workers=world - 1, timeout=60, multiprocessing_context="fork")
        path = Path(out) / "state.json"
        resumed = path.exists()
        if resumed:
            dl.load_state_dict(json.loads(path.read_text()))
        ids = []
        for batch in dl:
            ids.append(batch["sample_id"].numpy())
            step = torch.ones(1)
            dist.all_reduce(step)
            if not resumed and dl.batches_done == 3:
                break
        if rank == 0 and not resumed:
            path.write_text(json.dumps(dl.state_dict()))
        np.save(Path(out) / f"elastic-w{world}-rank{rank}.npy", np.concatenate(ids))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def fx(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("ddp"),
        "shards",
        n_shards=5,
        cells=101,
        genes=30,
        seed=2,
        splits=("train",),
    )


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_ranks_split_the_epoch(
    fx: Any, tmp_path: Path, world: int, gloo_world: Callable[..., None]
) -> None:
    gloo_world(_rank_main, world, str(fx.root), str(tmp_path), deadline=DEADLINE)
    split = fx.primary_ids("train")
    for pad in (0, 1):
        per_rank = [np.load(tmp_path / f"ids-pad{pad}-rank{r}.npy") for r in range(world)]
        steps = [tuple(np.load(tmp_path / f"steps-pad{pad}-rank{r}.npy")) for r in range(world)]
        assert (
            len(set(steps)) == 1 and steps[0][0] == 2 * steps[0][1]
        )  # equal batch counts = len(dl) per epoch
        union = np.concatenate(per_rank)
        if pad:  # everything, ceil(N/world) per rank, repeats allowed
            assert set(union.tolist()) == set(split.tolist())
            assert len(union) == world * -(-len(split) // world)
        else:  # disjoint, only the last N mod world units dropped
            assert len(union) == len(set(union.tolist())) == len(split) - len(split) % world
            assert set(union.tolist()) <= set(split.tolist())


def test_ddp_resume_on_another_world_size(
    fx: Any, tmp_path: Path, gloo_world: Callable[..., None]
) -> None:
    """Gloo: 3 steps of an epoch on 2 ranks (1 worker each), resumed from rank 0's state on 3
    ranks (2 workers each): every train unit served, repeats fewer than one global batch (12)."""
    for world in (2, 3):
        gloo_world(_elastic_main, world, str(fx.root), str(tmp_path), deadline=DEADLINE)
    first = [np.load(tmp_path / f"elastic-w2-rank{r}.npy") for r in range(2)]
    rest = [np.load(tmp_path / f"elastic-w3-rank{r}.npy") for r in range(3)]
    assert {a.size for a in first} == {18} and len({a.size for a in rest}) == 1
    served = np.concatenate(first + rest).tolist()
    split = fx.primary_ids("train").tolist()
    assert set(served) == set(split)
    assert len(served) - len(split) < 12
