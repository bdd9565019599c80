"""A resume state is a file anyone can edit: every field is ranged against the epoch it resumes,
and a state carries a digest of its own, so an edited one is refused as an edited index is; a
state saved before digests loads with a warning. The cases are the rows of
``tests/hostile/tampered_states.py``."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from loaders.epoch.resume import state_digest
from tests import hostile


@pytest.fixture(scope="module")
def datasets(
    build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory, ct_npy: Any
) -> dict[str, Callable[[], ShardLoader]]:
    """A loader factory per dataset: cells in batches of 64, CT volumes by a voxel budget."""
    cells = build_dataset(
        tmp_path_factory.mktemp("tampered-cells"), "shards", n_shards=4, cells=150, genes=8
    ).root
    root = tmp_path_factory.mktemp("tampered-ct")
    (root / "vols").mkdir()
    for i in range(9):  # 9 volumes of 20-100 lung points
        vol = np.full((12, 12, 6), -1000, np.int16)
        vol[1:11, 1:11, :] = 40
        vol[3:9, 3:9, 1 : 2 + i // 2] = -850
        np.save(root / "vols" / f"v{i}.npy", vol)
    ct = ct_npy.make(root, "zarr", extra="min_points = 10", jobs=1)

    def cells_loader() -> ShardLoader:
        return ShardLoader(ShardDataset(cells, batch_size=64, decode_process=False))

    def ct_loader() -> ShardLoader:
        ds = ShardDataset(ct, sample="ct", max_points_per_batch=400, seed=1, decode_process=False)
        return ShardLoader(ds)

    return {"cells": cells_loader, "ct": ct_loader}


def _served(dl: ShardLoader) -> list[list[int]]:
    return [b["sample_id"].tolist() for b in dl]


@hostile.parametrize
def test_a_tampered_state_is_refused(
    case: hostile.Case, datasets: dict[str, Callable[[], ShardLoader]]
) -> None:
    name, edits, reseal, outcome = case.data
    dl = datasets[name]()
    it = iter(dl)
    next(it)
    state = json.loads(json.dumps(dl.state_dict()))  # as a checkpoint stores it
    del it
    assert state["digest"] == state_digest(state)
    for key, value in edits.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    if reseal:
        state["digest"] = state_digest(state)
    fresh = datasets[name]()
    if outcome == "warn":
        with pytest.warns(RuntimeWarning, match="no digest"):
            fresh.load_state_dict(state)
        sealed = datasets[name]()
        sealed.load_state_dict(json.loads(json.dumps(dl.state_dict())))
        assert _served(fresh) == _served(sealed)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a version-3 state also warns
        with pytest.raises(ValueError, match=f"'{outcome}'"):
            fresh.load_state_dict(state)
    assert len(_served(fresh)) == len(fresh)  # the refused state left the loader as it was


def test_a_sealed_state_round_trips(datasets: dict[str, Callable[[], ShardLoader]]) -> None:
    """Its own state, through JSON, loads on both kinds of batches (the checks refuse no
    honest state), and the epoch goes on where it stopped."""
    for make in datasets.values():
        dl = make()
        it = iter(dl)
        next(it)
        state = json.loads(json.dumps(dl.state_dict()))
        rest = [b["sample_id"].tolist() for b in it]
        again = make()
        again.load_state_dict(state)
        assert _served(again) == rest
