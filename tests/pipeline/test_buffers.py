"""Reused buffers (pipeline.buffers): a thread's reads and chunks land in the same memory from one
block and shard to the next, scipy keeps them without a copy, and a shard's cached chunk is
never served after another shard refilled the buffers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.buffers import STAGE, Scratch, thread_scratch
from pipeline.build import build
from pipeline.modalities.perturbation.h5direct import DirectSlices
from pipeline.modalities.perturbation.spill import ShardRows, memory_piece
from pipeline.writers import blosc_into, zarr_direct


def test_a_name_reuses_its_memory_and_grows_once() -> None:
    s = Scratch()
    a = s.get("x", np.float32, 1000)
    b = s.get("x", np.float32, 600)
    assert np.shares_memory(a, b)
    c = s.get("x", np.float32, 1100)  # grown: at least 1.25x, so the next few sizes fit
    assert not np.shares_memory(a, c) and c.base.size >= 1250
    assert np.shares_memory(c, s.get("x", np.float32, 1200))
    assert s.get("x", np.int64, 10).dtype == np.int64  # another type: its own buffer
    assert s.nbytes == 80


def test_scipy_keeps_the_views_without_a_copy() -> None:
    """scipy copies an index array whose base is over twice its size (`_prune_array`): a typed
    buffer's views pass, a byte buffer's never would."""
    s = Scratch()
    s.get("data", np.float32, 1_000)
    data, indices = s.get("data", np.float32, 900), s.get("indices", np.int32, 900)
    data[:] = 1
    indices[:] = np.arange(900) % 30
    m = sp.csr_matrix((data, indices, np.arange(0, 901, 30)), shape=(30, 30))
    assert np.shares_memory(m.data, data) and np.shares_memory(m.indices, indices)


def test_each_thread_has_its_own() -> None:
    got: list[Scratch] = []
    t = threading.Thread(target=lambda: got.append(thread_scratch()))
    t.start()
    t.join()
    assert thread_scratch() is thread_scratch() and got[0] is not thread_scratch()


def test_direct_reads_land_in_the_stage_buffer(tmp_path: Path) -> None:
    a = np.arange(10_000, dtype=np.float32)
    with h5py.File(tmp_path / "t.h5", "w") as f:
        f["X/data"] = a
    reader, s = DirectSlices(tmp_path / "t.h5"), Scratch()
    with h5py.File(tmp_path / "t.h5", "r") as f:
        first = reader.read(f["X/data"], 0, 5_000, s)
        assert np.array_equal(first, a[:5_000])
        second = reader.read(f["X/data"], 5_000, 9_000, s)
        assert np.array_equal(second, a[5_000:9_000])
        assert np.shares_memory(second, s.buffers[STAGE + "data"])
        assert np.shares_memory(first, second)  # the first block's memory, read over
    reader.close()


def _rows(seed: int, n: int) -> ShardRows:
    """A shard of `n` rows in one memory piece."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 6, n).astype(np.int64)
    nnz = int(lengths.sum())
    piece = memory_piece(
        {
            "pos": np.arange(n, dtype=np.int64),
            "lengths": lengths,
            "data": rng.random(nnz).astype(np.float32),
            "indices": rng.integers(0, 50, nnz).astype(np.int32),
        }
    )
    return ShardRows([piece], n, 50, {}, f"shard-{seed}")


def test_a_shards_cached_chunk_is_refetched_after_another_shard_used_the_buffers() -> None:
    one, two = _rows(1, 40), _rows(2, 40)
    want = one.rows(0, 20, True)["data"].copy()
    two.rows(0, 20, True)  # the same thread's buffers, refilled with another shard's rows
    assert np.array_equal(one.rows(0, 20, True)["data"], want)


def test_a_cached_chunk_survives_other_buffers_of_the_thread() -> None:
    """Only a get of the chunk's own gathered buffers drops it: reads into the staging buffers
    and Blosc's destination (used between a chunk's data and its indices) keep it, so one gather
    serves both arrays."""
    one = _rows(3, 40)
    first = one.rows(0, 20, True)
    thread_scratch().get(STAGE + "data", np.float32, 10)
    thread_scratch().get("blosc-test", np.uint8, 10)
    assert one.rows(0, 20, True) is first


def test_a_build_leaves_no_buffers_on_the_callers_thread(
    tmp_path: Path, small_manifest: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One job runs the tasks inline, on the caller's thread: the build drops that thread's
    scratch, Blosc's destinations with it, when its tasks are done."""
    held: list[bool] = []  # each encode: its destination is a buffer of the thread's scratch
    real = blosc_into.BloscInto.encode

    def encode(self: blosc_into.BloscInto, buf: np.ndarray) -> memoryview:
        out = real(self, buf)
        held.append(np.shares_memory(np.asarray(out), thread_scratch().buffers[self.name]))
        return out

    monkeypatch.setattr(blosc_into.BloscInto, "encode", encode)
    monkeypatch.setattr(zarr_direct, "_TEMPLATES", {})  # this process's encoders, made anew
    build(small_manifest(tmp_path), tmp_path / "out", jobs=1, progress=False)
    assert held and all(held)  # the build compressed into the scratch
    assert thread_scratch().nbytes == 0


def test_edge_chunks_are_padded_in_the_threads_scratch() -> None:
    """The zarr writer pads a short last chunk in the thread's scratch (one byte buffer for every
    dtype), so a build's release drops it with the rest; the padded chunk is the rows, then
    zeros."""
    scratch = thread_scratch()
    pad = zarr_direct._pad_buffer((4, 3), np.dtype(np.float32))
    assert np.shares_memory(pad, scratch.buffers[zarr_direct.PAD])
    ints = zarr_direct._pad_buffer((5,), np.dtype(np.int64))
    assert np.shares_memory(ints, scratch.buffers[zarr_direct.PAD])  # the same bytes, reused
    template = zarr_direct.ArrayTemplate.__new__(zarr_direct.ArrayTemplate)
    template.encoders = []  # raw chunk bytes: the padding itself is what is checked
    got = dict(zarr_direct.chunks(template, np.arange(6, dtype=np.int32), 4))
    assert np.frombuffer(bytes(got["c/1"]), np.int32).tolist() == [4, 5, 0, 0]
