"""ShardDataset / ShardLoader against datasets written by the real shard writer (build_dataset's
stage="shards", tests/conftest.py)."""

from __future__ import annotations

import gc
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import scipy.sparse as sp
import torch

from loaders import ShardDataset, ShardLoader
from loaders.format import (
    OBS_PREFIX,
    PAIRS,
    PRIMARY,
    SAMPLE_ID,
    SENTENCES_CTRL,
    SENTENCES_PERT,
    FormatError,
    ShardEntry,
    index_digest,
    read_index,
)

TIMEOUT = 60  # seconds a worker may take for a batch: a hang fails the test instead of blocking it


@pytest.fixture(scope="module")
def fx(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("demo"),
        "shards",
        n_shards=6,
        cells=150,
        genes=40,
        seed=1,
        splits=("train", "train", "val"),
    )


@pytest.fixture(scope="module")
def truth(fx: Any) -> Any:
    """What was written, by sample_id (duplicated controls share the id of their original)."""
    return fx.truth


def epoch(dl: ShardLoader) -> list[dict[str, torch.Tensor]]:
    return list(dl)


@pytest.mark.process
@pytest.mark.parametrize("workers", [0, 2])
def test_cells_epoch_is_a_permutation_of_the_split(
    fx: Any, truth: Any, workers: int, check_cells: Callable[..., None]
) -> None:
    ds = ShardDataset(fx.root, split="train", sample="cells", batch_size=64, seed=3, window=2)
    dl = ShardLoader(ds, num_workers=workers, timeout=TIMEOUT)
    batches = epoch(dl)
    assert len(batches) == len(dl)
    ids = np.concatenate([b["sample_id"].numpy() for b in batches])
    np.testing.assert_array_equal(np.sort(ids), np.sort(fx.primary_ids("train")))
    for b in batches:
        check_cells(b, truth)
    dl.set_epoch(1)
    ids1 = np.concatenate([b["sample_id"].numpy() for b in dl])
    assert sorted(ids1) == sorted(ids) and not np.array_equal(ids1, ids)


def test_natural_order_without_shuffle(fx: Any) -> None:
    ds = ShardDataset(fx.root, split="val", batch_size=50, shuffle=False)
    ids = np.concatenate([b["sample_id"].numpy() for b in ShardLoader(ds)])
    np.testing.assert_array_equal(ids, fx.primary_ids("val"))


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.process)])
def test_sparse_and_shipped_parts_match_dense(fx: Any, workers: int) -> None:
    def make(**kw: object) -> ShardLoader:
        ds_kw = {k: kw.pop(k) for k in ("densify", "torch_sparse") if k in kw}
        return ShardLoader(
            ShardDataset(fx.root, batch_size=40, seed=5, **ds_kw),  # type: ignore[arg-type]
            num_workers=workers,
            timeout=TIMEOUT,
            **kw,
        )

    dense = epoch(ShardLoader(ShardDataset(fx.root, batch_size=40, seed=5)))
    csr = epoch(make(densify=False))
    sparse = epoch(make(densify=False, torch_sparse=True))
    parts = epoch(make(device="cpu", ship_csr=True))
    csr_shipped = epoch(
        make(densify=False, device="cpu", ship_csr=True)
    )  # the device path's CSR hand-over
    host_shipped = epoch(
        make(ship_csr=True)
    )  # shipped as for a device, finished by the numpy finisher here
    n_cols = dense[0]["X"].shape[1]
    for d, c, s, p, cs, hs in zip(
        dense, csr, sparse, parts, csr_shipped, host_shipped, strict=True
    ):
        want = d["X"].numpy()
        assert s["X"].layout == torch.sparse_csr
        np.testing.assert_array_equal(s["X"].to_dense().numpy(), want)
        for shipped in (p, hs):
            np.testing.assert_array_equal(shipped["X"].numpy(), want)
            assert set(shipped) == set(d)
        for got in (c, cs):  # densify=False: the CSR parts, nothing else in their place
            assert set(got) == (set(d) - {"X"}) | {"X.crow", "X.cols", "X.vals"}
            crow, cols, vals = (got[f"X.{n}"].numpy() for n in ("crow", "cols", "vals"))
            assert crow.dtype == cols.dtype and vals.dtype == np.float32
            rebuilt = sp.csr_matrix((vals, cols, crow), shape=(crow.size - 1, n_cols)).toarray()
            np.testing.assert_array_equal(rebuilt, want)
            np.testing.assert_array_equal(got["sample_id"].numpy(), d["sample_id"].numpy())


def test_cuda_request_without_cuda_falls_back(fx: Any) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.warns(RuntimeWarning, match="CUDA"):
        dl = ShardLoader(ShardDataset(fx.root, batch_size=100), device="cuda")
    assert next(iter(dl))["X"].device.type == "cpu"


@pytest.mark.process
@pytest.mark.parametrize("workers", [0, 2])
def test_pairs_reference_the_right_cells(fx: Any, truth: Any, workers: int) -> None:
    ds = ShardDataset(fx.root, split="train", sample="pairs", batch_size=48, seed=1, window=2)
    batches = epoch(ShardLoader(ds, num_workers=workers, timeout=TIMEOUT))
    expected = sorted(
        (int(s[SAMPLE_ID][c]), int(s[SAMPLE_ID][p]))
        for s, sp in zip(fx.shards, fx.splits, strict=True)
        if sp == "train"
        for c, p in s[PAIRS]
    )
    got = []
    for b in batches:
        c, p = b["ctrl_id"].numpy(), b["pert_id"].numpy()
        got += list(zip(c.tolist(), p.tolist(), strict=True))
        np.testing.assert_array_equal(b["x_ctrl"].numpy(), truth.dense[c])
        np.testing.assert_array_equal(b["x_pert"].numpy(), truth.dense[p])
        assert (truth.obs["perturbation"][c] == 0).all() and (
            truth.obs["perturbation"][p] != 0
        ).all()
        np.testing.assert_array_equal(b["perturbation"].numpy(), truth.obs["perturbation"][p])
        np.testing.assert_array_equal(b["cond"].numpy(), truth.vectors[truth.cond_id[p]])
    assert sorted(got) == expected


@pytest.mark.process
@pytest.mark.parametrize("workers", [0, 2])
def test_sentences_reference_the_right_cells(fx: Any, truth: Any, workers: int) -> None:
    ds = ShardDataset(fx.root, split="train", sample="sentences", batch_size=16, seed=2, window=3)
    n = 0
    for b in ShardLoader(ds, num_workers=workers, timeout=TIMEOUT):
        p, c = b["pert_id"].numpy(), b["ctrl_id"].numpy()
        bsz, length = p.shape
        assert b["x_pert"].shape == (bsz, length, fx.n_genes) and b["x_ctrl"].shape == (
            bsz,
            length,
            fx.n_genes,
        )
        np.testing.assert_array_equal(b["x_pert"].numpy(), truth.dense[p])
        np.testing.assert_array_equal(b["x_ctrl"].numpy(), truth.dense[c])
        pert_codes = truth.obs["perturbation"][p]
        assert (pert_codes == pert_codes[:, :1]).all() and (truth.obs["perturbation"][c] == 0).all()
        np.testing.assert_array_equal(b["perturbation"].numpy(), pert_codes[:, 0])
        np.testing.assert_array_equal(b["cond"].numpy(), truth.vectors[truth.cond_id[p[:, 0]]])
        n += bsz
    assert n == sum(
        s[SENTENCES_PERT].shape[0]
        for s, sp in zip(fx.shards, fx.splits, strict=True)
        if sp == "train"
    )
    assert all(s[SENTENCES_CTRL].shape == s[SENTENCES_PERT].shape for s in fx.shards)


@pytest.mark.process
@pytest.mark.parametrize(
    "workers_before,workers_after,persistent",
    [(0, 0, False), (2, 2, False), (2, 0, False), (0, 2, True)],
)
def test_mid_epoch_resume(
    fx: Any, workers_before: int, workers_after: int, persistent: bool
) -> None:
    def make(workers: int) -> ShardLoader:
        return ShardLoader(
            ShardDataset(fx.root, batch_size=32, seed=9, window=2),
            num_workers=workers,
            timeout=TIMEOUT,
            persistent_workers=persistent,
        )

    ref = make(0)
    ref.set_epoch(4)
    full = [b["sample_id"].numpy() for b in ref]
    dl = make(workers_before)
    dl.set_epoch(4)
    for k, _ in enumerate(dl, start=1):
        if k == 3:
            state = dl.state_dict()
            break
    assert state["batches_done"] == 3 and state["epoch"] == 4
    dl2 = make(workers_after)
    dl2.load_state_dict(state)
    dl2.set_epoch(4)  # same epoch: keeps the resume point
    rest = [b["sample_id"].numpy() for b in dl2]
    assert len(rest) == len(full) - 3
    for a, b in zip(rest, full[3:], strict=True):
        np.testing.assert_array_equal(a, b)
    assert dl2.state_dict()["batches_done"] == len(full)
    dl2.set_epoch(5)  # next epoch starts from its first batch
    assert len(list(dl2)) == len(full)


def test_resume_with_other_world_size_or_settings_is_refused(fx: Any) -> None:
    state = ShardLoader(ShardDataset(fx.root, rank=0, world_size=2)).state_dict()
    with pytest.raises(ValueError, match="world_size"):
        ShardLoader(ShardDataset(fx.root, rank=0, world_size=3)).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        ShardLoader(ShardDataset(fx.root, rank=1, world_size=2, batch_size=7)).load_state_dict(
            state
        )
    ShardLoader(ShardDataset(fx.root, rank=1, world_size=2)).load_state_dict(
        state
    )  # rank 0's state fits rank 1


@pytest.mark.process
def test_memory_does_not_grow_across_epochs(
    tmp_path: Path, build_dataset: Callable[..., Any]
) -> None:
    fx = build_dataset(tmp_path / "big", "shards", n_shards=4, cells=1500, genes=400, seed=0)
    dl = ShardLoader(ShardDataset(fx.root, batch_size=128, window=2))
    proc = psutil.Process()
    rss = []
    for e in range(8):
        dl.set_epoch(e)
        for _ in dl:
            pass
        gc.collect()
        rss.append(proc.memory_info().rss)
    arena_mb = 6000 * 40 * 8 / 2**20  # one epoch's decoded X, packed
    growth = (rss[-1] - rss[1]) / 2**20
    assert growth < max(8.0, 2 * arena_mb), f"RSS grew {growth:.1f} MiB over 6 epochs: {rss}"


@pytest.mark.process
def test_persistent_workers_follow_epochs(fx: Any) -> None:
    ds = ShardDataset(fx.root, batch_size=64, seed=4, window=2)
    dl = ShardLoader(ds, num_workers=2, persistent_workers=True, timeout=TIMEOUT)
    ref = ShardLoader(ShardDataset(fx.root, batch_size=64, seed=4, window=2))
    for e in (0, 1):
        dl.set_epoch(e)
        ref.set_epoch(e)
        got = np.concatenate([b["sample_id"].numpy() for b in dl])
        np.testing.assert_array_equal(got, np.concatenate([b["sample_id"].numpy() for b in ref]))


@pytest.mark.process
def test_spawn_start_method(fx: Any) -> None:
    ds = ShardDataset(fx.root, batch_size=64, seed=6, window=2)
    dl = ShardLoader(ds, num_workers=2, multiprocessing_context="spawn", timeout=TIMEOUT)
    ids = np.concatenate([b["sample_id"].numpy() for b in dl])
    ref = np.concatenate(
        [
            b["sample_id"].numpy()
            for b in ShardLoader(ShardDataset(fx.root, batch_size=64, seed=6, window=2))
        ]
    )
    np.testing.assert_array_equal(ids, ref)


@pytest.mark.process
@pytest.mark.parametrize("how", ["missing", "corrupt"])
@pytest.mark.parametrize("workers", [0, 2])
def test_broken_shard_error_names_the_file(
    fx: Any, tmp_path: Path, how: str, workers: int, broken_copy: Callable[..., Path]
) -> None:
    shard = broken_copy(fx, tmp_path / "ds", how)
    dl = ShardLoader(
        ShardDataset(tmp_path / "ds", batch_size=64, window=1), num_workers=workers, timeout=TIMEOUT
    )
    with pytest.raises(Exception, match=re.escape(str(shard))):
        for _ in dl:
            pass


@pytest.mark.process
@pytest.mark.parametrize("decode_process", [False, True])
def test_a_unit_count_that_disagrees_with_the_index_names_the_shard(
    fx: Any, tmp_path: Path, decode_process: bool
) -> None:
    root = tmp_path / "ds"
    shutil.copytree(fx.root, root)
    raw = json.loads((root / "index.json").read_text())
    entry = next(e for e in raw["shards"] if e["split"] == "train")
    entry["units"]["pairs"] -= 1  # the shard holds one pair more than index.json says
    raw["digest"] = index_digest(raw)  # a build that miscounted seals what it wrote
    (root / "index.json").write_text(json.dumps(raw))
    shard = read_index(root).shard_path(ShardEntry.from_json(entry))
    ds = ShardDataset(
        root, sample="pairs", batch_size=16, window=1, shuffle=False, decode_process=decode_process
    )
    with pytest.raises(
        FormatError, match=re.escape(str(shard)) + r".*pairs units.*index\.json says"
    ):
        for _ in ShardLoader(ds):
            pass
    ok = ShardDataset(
        root, sample="cells", batch_size=16, window=1, shuffle=False, decode_process=decode_process
    )
    assert (
        sum(len(b["sample_id"]) for b in ShardLoader(ok)) == ok.n_units
    )  # other sample types still load


def test_unknown_split_or_sample(fx: Any) -> None:
    with pytest.raises(ValueError, match=r"valid: \['train', 'val'\]"):
        ShardDataset(fx.root, split="test")
    with pytest.raises(ValueError, match="cells.*pairs.*sentences"):
        ShardDataset(fx.root, sample="genes")


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.process)])
def test_fewer_units_than_ranks(
    tmp_path: Path, workers: int, build_dataset: Callable[..., Any]
) -> None:
    fx = build_dataset(tmp_path / "tiny", "shards", n_shards=1, cells=3, genes=10, seed=0)
    for pad, per_rank in ((True, 1), (False, 0)):
        for rank in range(5):
            ds = ShardDataset(
                fx.root, batch_size=4, pad=pad, rank=rank, world_size=5, shuffle=False
            )
            batches = list(ShardLoader(ds, num_workers=workers, timeout=TIMEOUT))
            assert len(batches) == per_rank == len(ds)
            if pad:  # padding repeats the split: rank r gets global position r mod 3
                assert batches[0]["sample_id"].tolist() == [fx.primary_ids("train")[rank % 3]]


@pytest.mark.process
def test_shuffle_mixes_perturbations_like_uniform_sampling(fx: Any) -> None:
    ds = ShardDataset(fx.root, batch_size=32, drop_last=True, window=2)
    dl = ShardLoader(ds)
    distinct = []
    for e in range(4):
        dl.set_epoch(e)
        distinct += [len(np.unique(b["perturbation"].numpy())) for b in dl]
    labels = np.concatenate(
        [
            s[OBS_PREFIX + "perturbation"][s[PRIMARY]]
            for s, sp in zip(fx.shards, fx.splits, strict=True)
            if sp == "train"
        ]
    )
    rng = np.random.default_rng(0)
    uniform = np.mean([len(np.unique(rng.choice(labels, 32, replace=False))) for _ in range(2000)])
    assert abs(np.mean(distinct) - uniform) / uniform < 0.10, (np.mean(distinct), uniform)


@pytest.mark.parametrize("decode_process", [False, True])
def test_window_of_the_whole_split_is_decoded_once(fx: Any, decode_process: bool) -> None:
    """window >= shards: every epoch is one window of the same shards; it is decoded once and
    re-ordered per epoch, with the same batches as decoding it every epoch."""

    def run(ds: ShardDataset) -> tuple[list[np.ndarray], int]:
        calls: list[int] = []
        engine = ds.engine_here()
        decode = engine.decode_window
        engine.decode_window = lambda *a, **k: calls.append(a[0]) or decode(*a, **k)  # type: ignore[method-assign]
        dl, ids = ShardLoader(ds), []
        for e in range(3):
            dl.set_epoch(e)
            ids += [np.concatenate([b["sample_id"].numpy() for b in dl])]
        return ids, sum(
            e < 3 for e in calls
        )  # epoch 3's speculative decode may or may not find epoch 2's window

    kw = {"batch_size": 40, "seed": 3, "window": 100, "decode_process": decode_process}
    reused, decodes = run(ShardDataset(fx.root, **kw))  # type: ignore[arg-type]
    fresh, fresh_decodes = run(ShardDataset(fx.root, decode_ahead=False, **kw))  # type: ignore[arg-type]
    assert (decodes, fresh_decodes) == (1, 3)
    for a, b in zip(reused, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(reused[0], reused[1])  # still a new shuffle every epoch
