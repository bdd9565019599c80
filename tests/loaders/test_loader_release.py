"""A dataset the trainer drops is freed, and its decoder process ends: no reference cycle keeps it
for the cyclic garbage collector, and nothing keeps it for good (a trainer that builds a loader
per validation run would otherwise collect one decoder process per run)."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardDataset, ShardLoader

pytestmark = pytest.mark.process  # the decoder process (and DataLoader workers)

# window=1: several windows an epoch (a one-window split never starts a decoder process)
KW: dict[str, Any] = {"split": "train", "batch_size": 16, "window": 1, "seed": 0}


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _ended(proc: Any, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.poll() is not None


def _gone(ref: weakref.ref[ShardDataset], collect: bool, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while ref() is not None and time.monotonic() < deadline:
        if collect:
            gc.collect()
        time.sleep(0.05)
    return ref() is None


def _read_and_drop(root: Path, workers: int) -> tuple[weakref.ref[ShardDataset], Any]:
    """A dataset read for two epochs, then dropped: (a weak reference to it, its decoder's
    process)."""
    ds = ShardDataset(root, **KW)
    loader = ShardLoader(ds, num_workers=workers)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        assert sum(1 for _ in loader) > 0
    assert ds.engine_here().decoder_state is not None, (
        "the default engine decodes in a decoder process"
    )
    proc = ds.engine_here().decoder_state.proc
    return weakref.ref(ds), proc


def test_a_dropped_dataset_is_freed_at_once(
    built_zarr_tar: dict[str, Path], no_cyclic_gc: None
) -> None:
    ref, proc = _read_and_drop(built_zarr_tar["zarr"], 0)
    # freed by reference counting alone (the cyclic GC is off here), once the decode of the next
    # epoch's first window, started ahead in a thread, has finished
    assert _gone(ref, collect=False), "a reference cycle keeps the dataset until the cyclic GC runs"
    assert _ended(proc), "its decoder process still runs"


def test_a_dataset_read_with_workers_is_freed_when_dropped(
    built_zarr_tar: dict[str, Path],
) -> None:
    ref, proc = _read_and_drop(built_zarr_tar["zarr"], 2)
    # torch's persistent-worker iterator shuts its workers down (joins them) in whichever thread
    # drops it last, which takes a moment; the dataset goes after it
    assert _gone(ref, collect=True), "something keeps the dropped dataset alive (the broker?)"
    assert _ended(proc), "its decoder process still runs"
