"""The loader's zarr reads and window arenas: the same data as zarr-python, whatever the chunking."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import pipeline.writers.zarr_writer as zarr_writer
from loaders import ShardDataset, ShardLoader
from loaders.engine.process import ProcessEngine
from loaders.epoch import order
from loaders.epoch.schedule import batch_segments
from loaders.format import FormatError
from loaders.format.readers import open_shard, open_zarr_columns, read_shard
from pipeline.writers import Codec, get_writer

TIMEOUT = 60  # seconds a worker may take for a batch: a hang fails the test instead of blocking it


def columns(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "X/indices": rng.integers(0, 2000, n).astype(np.int32),
        "X/data": rng.standard_normal(n).astype(np.float32),
        "emb": rng.standard_normal((n // 7, 3)).astype(np.float32),
        "flag": rng.random(n // 5) < 0.5,
        "empty": np.zeros(0, np.int64),
    }


@pytest.mark.parametrize("codec", ["blosc-lz4", "blosc-zstd", "zstd", "none"])
def test_reader_matches_zarr_python(
    tmp_path: Path, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        zarr_writer, "CHUNK_BYTES", 4000
    )  # several chunks per array, a partial edge chunk
    cols = columns(np.random.default_rng(0), 2500)
    path = tmp_path / "s.zarr"
    get_writer("zarr", Codec(codec, 3 if codec != "none" else 0)).write(path, cols)
    got = read_shard(path, "zarr", list(cols))
    group = zarr.open_group(str(path), mode="r")
    for k, a in cols.items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape
        np.testing.assert_array_equal(got[k], a)
        np.testing.assert_array_equal(group[k][...], a)
    # into a caller's (pooled, longer) buffer: only the first rows are written
    col = open_zarr_columns(path, ["X/data"])["X/data"]
    out = np.full(col.capacity + 3, -7, np.float32)
    np.testing.assert_array_equal(col.read_into(out), cols["X/data"])
    assert (out[col.capacity :] == -7).all()
    with pytest.raises(FormatError, match="X/data"):
        col.read_into(np.zeros(col.shape[0] - 1, np.float32))


def test_any_zarr_layout_reads(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    group = zarr.open_group(str(tmp_path / "z.zarr"), mode="w")
    grid = group.create_array(
        "grid", shape=(50, 30), chunks=(20, 7), dtype="float32"
    )  # chunked along axis 1
    grid[...] = rng.random((50, 30)).astype(np.float32)
    sparse = group.create_array("sparse", shape=(100,), chunks=(30,), dtype="int32", fill_value=7)
    sparse[:30] = np.arange(30)  # chunks 1..3 never written: the fill value
    got = read_shard(tmp_path / "z.zarr", "zarr", ["grid", "sparse"])
    np.testing.assert_array_equal(got["grid"], grid[...])
    np.testing.assert_array_equal(got["sparse"], np.r_[np.arange(30), np.full(70, 7)])


def test_corrupt_chunk_is_named(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    get_writer("zarr", Codec()).write(path, {"a": np.arange(1000, dtype=np.int64)})
    chunk = path / "a" / "c" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2 :] = b"\xff" * (len(data) - len(data) // 2)
    chunk.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"s\.zarr"):
        read_shard(path, "zarr", ["a"])
    assert open_shard(path, "zarr", ["a"])["a"].shape == (1000,)


@pytest.fixture(scope="module")
def chunky(
    build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Any]:
    """Shards whose X spans several chunks with padded edges, decoded into arena slices in place."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zarr_writer, "CHUNK_BYTES", 1000)
        fx = build_dataset(
            tmp_path_factory.mktemp("chunky"),
            "shards",
            n_shards=5,
            cells=120,
            genes=60,
            seed=4,
            density=0.2,
        )
    first = fx.root / "shards" / sorted(p.name for p in (fx.root / "shards").iterdir())[0]
    assert zarr.open_group(str(first), mode="r")["X/indices"].nchunks > 1
    return fx.root, fx.truth


@pytest.mark.process
@pytest.mark.parametrize("workers", [0, 2])
def test_multi_chunk_shards_give_the_written_cells(
    chunky: tuple[Path, Any], workers: int, check_cells: Callable[..., None]
) -> None:
    root, truth = chunky
    for window in (1, 2, 5):
        dl = ShardLoader(
            ShardDataset(root, batch_size=37, seed=window, window=window),
            num_workers=workers,
            timeout=TIMEOUT,
        )
        for e in (0, 1):
            dl.set_epoch(e)
            ids = []
            for b in dl:
                check_cells(b, truth)
                ids.append(b["sample_id"].numpy())
            assert np.unique(np.concatenate(ids)).size == sum(len(i) for i in ids)


@pytest.mark.process
def test_pairs_and_sentences_from_multi_chunk_shards(chunky: tuple[Path, Any]) -> None:
    root, truth = chunky
    for b in ShardLoader(ShardDataset(root, sample="pairs", batch_size=29, window=2)):
        np.testing.assert_array_equal(b["x_ctrl"].numpy(), truth.dense[b["ctrl_id"].numpy()])
        np.testing.assert_array_equal(b["x_pert"].numpy(), truth.dense[b["pert_id"].numpy()])
    for b in ShardLoader(ShardDataset(root, sample="sentences", batch_size=5, window=3)):
        np.testing.assert_array_equal(b["x_pert"].numpy(), truth.dense[b["pert_id"].numpy()])
        np.testing.assert_array_equal(b["x_ctrl"].numpy(), truth.dense[b["ctrl_id"].numpy()])


@pytest.mark.process
@pytest.mark.parametrize("decode_ahead", [True, False])
def test_each_window_is_decoded_once_per_epoch(
    chunky: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch, decode_ahead: bool
) -> None:
    calls: list[tuple[int, int]] = []
    read_window = ProcessEngine.read_window

    def counting(self: ProcessEngine, epoch: int, w: int, pool: object = None) -> object:
        calls.append((epoch, w))
        return read_window(self, epoch, w, pool)  # type: ignore[arg-type]

    monkeypatch.setattr(ProcessEngine, "read_window", counting)
    ds = ShardDataset(chunky[0], batch_size=16, window=2, decode_ahead=decode_ahead)
    dl = ShardLoader(ds)
    for e in (0, 1):
        dl.set_epoch(e)
        assert sum(1 for _ in dl) == len(dl)
    # 5 shards, windows of 2; with decode-ahead the epoch-1 first window was decoded during epoch 0
    # (and adopted, not decoded again), and epoch 2's first window is being decoded now
    ahead = (
        [
            (
                2,
                batch_segments(
                    order.window_bounds(ds.counts, 0, 2, 2)[1].tolist(),
                    ds.units_per_rank(),
                    0,
                    16,
                    0,
                )[1][0],
            )
        ]
        if decode_ahead
        else []
    )
    assert sorted(calls) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), *ahead]


@pytest.mark.process
def test_next_epoch_decoded_ahead_is_used_or_dropped(
    chunky: tuple[Path, Any], check_cells: Callable[..., None]
) -> None:
    """The speculative decode of the next epoch's first window serves that epoch; another epoch
    drops it (its batches are still exactly right), and the buffers go back to the pool."""
    root, truth = chunky
    dl = ShardLoader(ShardDataset(root, batch_size=16, window=2))
    dl.set_epoch(0)
    list(dl)
    assert dl.dataset.engine_here().ahead is not None and dl.dataset.engine_here().ahead[0][0] == 1
    for epoch in (1, 5):  # 1: adopted; 5: the epoch-2 decode is dropped
        dl.set_epoch(epoch)
        ids = []
        for b in dl:
            check_cells(b, truth)
            ids.append(b["sample_id"].numpy())
        assert np.unique(np.concatenate(ids)).size == sum(map(len, ids)) == dl.dataset.n_units
        assert (
            dl.dataset.engine_here().ahead is not None
            and dl.dataset.engine_here().ahead[0][0] == epoch + 1
        )


@pytest.mark.process
def test_device_side_densify_matches_host(chunky: tuple[Path, Any]) -> None:
    """The GPU path ships (crow, cols, vals) and densifies with torch ops; the same code runs on CPU
    tensors."""
    import torch

    from loaders.modalities.perturbation.ops import densify
    from loaders.modalities.perturbation.torch_ops import densify_torch

    batch = next(
        iter(ShardLoader(ShardDataset(chunky[0], batch_size=50), device="cpu", ship_csr=True))
    )
    dense = batch["X"].numpy()
    crow = np.zeros(dense.shape[0] + 1, np.int64)
    np.cumsum((dense != 0).sum(axis=1), out=crow[1:])
    cols = np.nonzero(dense)[1].astype(np.int32)
    vals = dense[dense != 0]
    np.testing.assert_array_equal(densify(crow, cols, vals, dense.shape), dense)
    got = densify_torch(
        torch.from_numpy(crow), torch.from_numpy(cols), torch.from_numpy(vals), dense.shape
    )
    np.testing.assert_array_equal(got.numpy(), dense)
