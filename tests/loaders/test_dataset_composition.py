"""ShardDataset is composed, not mixed in: what crosses into a worker is plain (spec, epoch plan),
the process's machinery is one object made per process, and ShardLoader tells the dataset how
batches leave in one settings object instead of writing its attributes."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
from torch.utils.data import IterableDataset

from loaders import ShardDataset, ShardLoader
from loaders.engine.process import LoaderSettings, PerProcess


@pytest.fixture(scope="module")
def fx(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("compose"), "shards", n_shards=3, cells=60, genes=20, seed=5
    )


def test_at_most_one_base_class_besides_iterable_dataset() -> None:
    bases = [b for b in ShardDataset.__bases__ if b is not IterableDataset]
    assert len(bases) <= 1, bases


def test_a_used_dataset_pickles_without_its_machinery(fx: Any) -> None:
    """The engine a process made (threads, pools, live windows) stays behind: the copy starts
    with an empty slot and makes its own, serving the same batches."""
    ds = ShardDataset(fx.root, batch_size=16, window=1, decode_process=False)
    first = [b["sample_id"].tolist() for b in ds]
    engine = ds.engine_here()
    assert engine.threads is not None and engine.pool is not None  # the machinery is live
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._engine.value is None
    assert [b["sample_id"].tolist() for b in copy] == first
    assert copy.engine_here() is not engine


def test_the_per_process_slot_makes_one_object_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    slot: PerProcess[list[Any]] = PerProcess()
    made: list[Any] = []
    first = slot.get(lambda parent: made.append(parent) or ["mine"])
    assert slot.get(lambda parent: ["again"]) is first  # the same process: the same object
    monkeypatch.setattr("os.getpid", lambda: -1)  # as a forked child sees it
    child = slot.get(lambda parent: made.append(parent) or ["child"])
    assert child == ["child"] and made == [None, ["mine"]] and slot.parents == [["mine"]]
    assert pickle.loads(pickle.dumps(slot)).value is None


def test_the_loader_configures_its_dataset_through_one_settings_object(fx: Any) -> None:
    ds = ShardDataset(fx.root, batch_size=16, window=1)
    before = set(vars(ds))
    assert ds.settings == LoaderSettings()
    dl = ShardLoader(ds, num_workers=2, timeout=7, partitions=1)
    assert set(vars(ds)) == before, set(vars(ds)) ^ before  # no attribute written besides
    s = ds.settings
    assert s.shipping is not None and s.timeout == 7 and s.partitions == 1 and s.shared is not None
    assert ds.plan.shared is s.shared and ds.plan.partitions == 1
    assert ds.decode_timeout == 7  # the loader's bound caps the decoder's silence
    assert len(dl) == ds.num_batches() > 0
