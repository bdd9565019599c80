"""ShardLoader keeps its DataLoader workers from one epoch to the next unless asked not to
(``persistent_workers=False``): respawning them every epoch cost most of the workers' gain
(issue 26 item 5). A resumed epoch laid out on another world reaches persistent workers too."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader

pytestmark = pytest.mark.process  # DataLoader workers


@pytest.fixture(scope="module")
def fx(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("persistent"), "shards", n_shards=4, cells=60, genes=12, seed=3
    )


def epoch_pids(dl: ShardLoader, epoch: int) -> tuple[set[int], np.ndarray]:
    """The worker processes alive while ``epoch`` is served, and its sample ids."""
    dl.set_epoch(epoch)
    pids: set[int] = set()
    ids = []
    for batch in dl:
        pids |= {p.pid for p in mp.active_children() if p.pid is not None}
        ids.append(batch["sample_id"].numpy())
    return pids, np.concatenate(ids)


@pytest.mark.parametrize("persistent", [None, False])
def test_workers_live_across_epochs_by_default(fx: Any, persistent: bool | None) -> None:
    def make() -> ShardDataset:
        return ShardDataset(fx.root, batch_size=16, window=2, seed=2, decode_process=False)

    kw = {} if persistent is None else {"persistent_workers": persistent}
    # children of earlier tests' loaders in this pytest process are not this loader's workers
    others = {p.pid for p in mp.active_children()}
    dl = ShardLoader(make(), num_workers=2, timeout=60, **kw)
    ref = ShardLoader(make())
    first, ids0 = epoch_pids(dl, 0)
    second, ids1 = epoch_pids(dl, 1)
    first, second = first - others, second - others
    assert len(first) >= 2 and len(second) >= 2
    if persistent is None:
        assert first == second  # the same worker processes served both epochs
    else:
        assert not first & second  # new ones each epoch
    for epoch, ids in ((0, ids0), (1, ids1)):
        ref.set_epoch(epoch)
        np.testing.assert_array_equal(ids, np.concatenate([b["sample_id"] for b in ref]))


def test_persistent_workers_follow_a_resumed_layout_then_the_next_epoch(fx: Any) -> None:
    """Resumed from a 4-rank state on 2 ranks, persistent workers serve the 4-partition rest of
    the epoch, then the ordinary 2-rank next epoch (the layout reaches them through shared
    memory)."""

    def make(rank: int, world: int) -> ShardDataset:
        return ShardDataset(
            fx.root,
            batch_size=8 // world,
            window=2,
            seed=2,
            rank=rank,
            world_size=world,
            decode_process=False,
        )

    four = ShardLoader(make(0, 4))
    for i, _ in enumerate(four):
        if i == 2:
            break
    state = four.state_dict()
    for rank in range(2):
        dl = ShardLoader(make(rank, 2), num_workers=2, timeout=60)
        ref = ShardLoader(make(rank, 2))
        next(iter(dl))  # workers started before the state is loaded: they must follow it
        for loader in (dl, ref):
            loader.load_state_dict(state)
        for epoch in (0, 1):
            dl.set_epoch(epoch)
            ref.set_epoch(epoch)
            got = [b["sample_id"].tolist() for b in dl]
            assert got == [b["sample_id"].tolist() for b in ref]
        assert dl.state_dict()["partitions"] == 2
