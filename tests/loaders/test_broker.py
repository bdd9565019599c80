"""Workers share one decode: each window decoded once per rank whatever num_workers, mapped
read-only by the workers, the same batches as num_workers=0, nothing left in /dev/shm, a dead
worker's holds dropped."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from loaders.engine.broker import Broker, BrokerClient
from loaders.engine.decoder import AVAILABLE

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not AVAILABLE, reason="the decoder process needs Linux memfd"),
]  # DataLoader workers and the decoder process
TIMEOUT = 60  # seconds a worker may take for a batch: a hang fails the test instead of blocking it
Helper = Callable[..., Any]  # a function from a fixture of tests/conftest.py or its plug-in


@pytest.fixture(scope="module")
def fx(build_dataset: Helper, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("broker"), "shards", n_shards=6, cells=80, genes=30, seed=3
    )


def shm() -> set[str]:
    """What this loader (or torch's batch transport, or Python's shared_memory) could leave in
    /dev/shm; other programs' files (other test runs on the machine) are not ours to judge."""
    names = os.listdir("/dev/shm") if Path("/dev/shm").is_dir() else []
    return {n for n in names if "shardsmith" in n or n.startswith(("torch_", "psm_"))}


@pytest.mark.parametrize("workers", [1, 3])
def test_each_window_decoded_once_for_all_workers(
    fx: Any, workers: int, batches: Helper, assert_same: Helper
) -> None:
    before = shm()
    kw = {"batch_size": 16, "seed": 2, "window": 2}
    want = batches(ShardDataset(fx.root, decode_process=False, **kw), epochs=(0, 1))  # type: ignore[arg-type]
    ds = ShardDataset(fx.root, **kw)  # type: ignore[arg-type]
    # workers respawned each epoch: exactly one decode per window and epoch (persistent ones, the
    # default, also decode the next epoch's first window ahead at the end of the last epoch)
    got = batches(ds, epochs=(0, 1), num_workers=workers, persistent_workers=False)
    assert_same(got, want)
    n_windows = -(-len(ds.entries) // 2)
    assert (
        ds.engine_here().broker is not None and ds.engine_here().broker.decodes == 2 * n_windows
    )  # once per window, not per worker
    del got
    assert shm() <= before  # memfds and an abstract socket: nothing to leak


def test_workers_map_windows_read_only_and_a_dead_client_lets_go(fx: Any, started: Helper) -> None:
    ds = started(ShardDataset(fx.root, batch_size=16, window=2))
    dec = ds.engine_here().decoder()
    assert dec is not None
    broker = Broker(dec, lambda e, w: 1 << 20)
    try:
        a, b = BrokerClient(broker.address), BrokerClient(broker.address)
        x, y = a.read_window(0, 0), b.read_window(0, 0)
        assert broker.decodes == 1
        col = x.columns["X/data"]
        assert not col.flags.writeable
        np.testing.assert_array_equal(col, y.columns["X/data"])
        holds = broker._windows[(0, 0)][1]
        assert holds[0] == 2
        a.close()  # a worker dies holding the window
        deadline = time.monotonic() + TIMEOUT
        while holds[0] != 1:
            assert time.monotonic() < deadline, "the dead client's hold was not dropped"
            time.sleep(0.01)
        y.release(
            ds.engine_here().buffers()
        )  # the last holder lets go: the window stays among the recent ones
        while holds[0] != 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert (0, 0) in broker._idle
        b.close()
    finally:
        broker.close()


def test_persistent_workers_share_the_decode_across_epochs(
    fx: Any, batches: Helper, assert_same: Helper
) -> None:
    kw = {"batch_size": 16, "seed": 4, "window": 2}
    ds = ShardDataset(fx.root, **kw)  # type: ignore[arg-type]
    dl = ShardLoader(ds, num_workers=2, persistent_workers=True, timeout=TIMEOUT)
    got = []
    for e in range(3):
        dl.set_epoch(e)
        got += list(dl)
    want = batches(ShardDataset(fx.root, decode_process=False, **kw), epochs=(0, 1, 2))  # type: ignore[arg-type]
    assert_same(got, want)
    assert (
        ds.engine_here().broker is not None and ds.engine_here().broker.decodes <= 3 * 3 + 1
    )  # (+ the 4th epoch's speculative first)
