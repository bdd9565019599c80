"""The workers' ring of reused shared-memory slots (loaders/engine/ring.py): slots freed only when
nothing views them, fallback when none is free or the cap is reached, and a real DataLoader whose
held batches never change."""

from __future__ import annotations

import gc
import io
import os
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from loaders.engine import ring
from loaders.engine.device import unpack_batches
from loaders.engine.transport import Payload, Shipped, to_shared

TIMEOUT = 60
pytestmark = pytest.mark.skipif(not ring.AVAILABLE, reason="no memfd_create on this platform")


@pytest.fixture(scope="module")
def fx(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("ring"), "shards", n_shards=4, cells=90, genes=30, seed=3
    )


def payload(value: int, n: int = 1000) -> Payload:
    return Payload(arrays={"x": np.full(n, value, np.int64)})


def through_pickle(item: Shipped) -> Shipped:
    """What the consumer gets: the item pickled the way a DataLoader worker's queue does."""
    buf = io.BytesIO()
    ForkingPickler(buf).dump(item)
    return ForkingPickler.loads(buf.getvalue())


def test_slot_freed_only_when_every_view_is_gone() -> None:
    r = ring.Ring(2, max_bytes=1 << 20)
    sent = to_shared([payload(7), payload(8)], "dense", r)
    assert sent.slot is not None
    slot = sent.slot[1]
    got = unpack_batches(through_pickle(sent))
    del sent
    gc.collect()
    assert r.control[slot] == ring.BUSY  # the consumer still views it
    x = got[1]["x"]
    del got
    gc.collect()
    assert r.control[slot] == ring.BUSY and int(x[0]) == 8  # one view is enough to keep it
    del x
    gc.collect()
    assert r.control[slot] == ring.FREE


def test_no_free_slot_falls_back_to_a_fresh_segment_and_held_items_stay_intact() -> None:
    r = ring.Ring(2, max_bytes=1 << 20)
    held = [through_pickle(to_shared([payload(i)], "dense", r)) for i in range(5)]
    assert sum(h.slot is None for h in held) == 5  # consumer side: no ring reference
    assert [int(unpack_batches(h)[0]["x"][-1]) for h in held] == [0, 1, 2, 3, 4]
    assert r.nbytes() <= 1 << 20


def test_cap_on_written_bytes() -> None:
    r = ring.Ring(4, max_bytes=64 << 10)
    assert r.slot_for(100 << 10) is None  # bigger than the cap
    a, b = r.slot_for(40 << 10), r.slot_for(40 << 10)
    assert a is not None and b is None  # the second would take the ring over its cap
    assert r.nbytes() == 40 << 10


def loader_batches(fx: Any, workers: int, **kw: object) -> list[dict[str, object]]:
    ds = ShardDataset(fx.root, split="train", batch_size=16, seed=4)
    dl = ShardLoader(ds, num_workers=workers, timeout=TIMEOUT, **kw)  # type: ignore[arg-type]
    dl.set_epoch(1)
    return list(dl)  # every batch held: far more items than the rings have slots


@pytest.mark.process
@pytest.mark.parametrize("worker_batches", [1, 3])
def test_held_batches_never_change_and_equal_the_main_process(fx: Any, worker_batches: int) -> None:
    want = loader_batches(fx, 0)
    got = loader_batches(fx, 2, worker_batches=worker_batches, prefetch_factor=1)
    assert len(got) == len(want) > 8
    gc.collect()
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in w:
            np.testing.assert_array_equal(g[k].numpy(), w[k].numpy(), err_msg=k)  # type: ignore[attr-defined]


@pytest.mark.process
def test_batches_released_as_used_come_through_the_ring(fx: Any) -> None:
    ds = ShardDataset(fx.root, split="train", batch_size=16, seed=4)
    dl = ShardLoader(ds, num_workers=2, timeout=TIMEOUT, worker_batches=2)
    for e in range(2):  # non-persistent workers: new rings each epoch, the exited ones' dropped
        dl.set_epoch(e)
        ids = [b["sample_id"].numpy().copy() for b in dl]
        assert len(np.unique(np.concatenate(ids))) == sum(i.size for i in ids)
    workers = [p for p in ring.receivers() if p != os.getpid()]
    assert (
        len(workers) == 2
    )  # the last epoch's workers' rings; the first epoch's (exited) were dropped


@pytest.mark.process
def test_a_plain_dataloader_gets_dict_batches(fx: Any) -> None:
    """Without ShardLoader, workers yield what torch can ship and a trainer can use: dicts of
    tensors."""
    from torch.utils.data import DataLoader

    want = loader_batches(fx, 0)
    ds = ShardDataset(fx.root, split="train", batch_size=16, seed=4)
    ds.set_epoch(1)
    got = list(DataLoader(ds, batch_size=None, num_workers=2, timeout=TIMEOUT))
    assert len(got) == len(want) and all(isinstance(b, dict) for b in got)
    for g, w in zip(got, want, strict=True):
        for k in w:
            np.testing.assert_array_equal(g[k].numpy(), w[k].numpy(), err_msg=k)  # type: ignore[attr-defined]
