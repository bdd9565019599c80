"""Fixtures of the loader tests (tests/loaders/): checking served cells against what was written,
a damaged copy of a dataset, and a dataset whose decoder process is up."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    import torch

    from loaders import ShardDataset

TIMEOUT = 60  # seconds the decoder process may take to start


def check_cells(batch: dict[str, torch.Tensor], truth: Any) -> None:
    """A batch of cells holds what build_dataset(stage="shards") wrote (``Dataset.truth``)."""
    import torch

    ids = batch["sample_id"].numpy()
    np.testing.assert_array_equal(batch["X"].numpy(), truth.dense[ids])
    np.testing.assert_array_equal(batch["cond_id"].numpy(), truth.cond_id[ids])
    np.testing.assert_array_equal(batch["cond"].numpy(), truth.vectors[truth.cond_id[ids]])
    for f in truth.obs:  # every obs field written
        assert batch[f].dtype == torch.int64
        np.testing.assert_array_equal(batch[f].numpy(), truth.obs[f][ids])
    np.testing.assert_array_equal(batch["obsm/pca"].numpy(), truth.pca[ids])


def broken_copy(ds: Any, dst: Path, how: str) -> Path:
    """A copy of a stage="shards" dataset whose shard 3 (train) is "missing" or "corrupt"."""
    shutil.copytree(ds.root, dst)
    shard = dst / "shards" / "shard-00003.zarr"  # a train shard
    if how == "missing":
        shutil.rmtree(shard)
    else:
        chunks = sorted(
            p for p in (shard / "X" / "data").rglob("*") if p.is_file() and p.name != "zarr.json"
        )
        chunks[0].write_bytes(b"\x00garbage" * 5)
    return shard


def started(ds: ShardDataset) -> ShardDataset:
    """Wait until the dataset's decoder process is up, so that every window goes through it."""
    dec = ds.engine_here().decoder()
    assert dec is not None
    deadline = time.monotonic() + TIMEOUT
    while not dec.ready():
        assert time.monotonic() < deadline, "decoder process did not start"
        time.sleep(0.01)
    return ds


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="session", name="check_cells")
def check_cells_fixture() -> Callable[..., Any]:
    """check_cells(batch, truth): a batch of cells is exact."""
    return check_cells


@pytest.fixture(scope="session", name="broken_copy")
def broken_copy_fixture() -> Callable[..., Any]:
    """broken_copy(ds, dst, how) -> the damaged shard's path."""
    return broken_copy


@pytest.fixture(scope="session", name="started")
def started_fixture() -> Callable[..., Any]:
    """started(ds) -> ds, once its decoder process is up."""
    return started
