"""Blosc into a reused buffer (pipeline.writers.blosc_into) gives numcodecs' bytes for every
setting the zarr writer passes, reuses its buffer, keeps threads apart, and falls back to
numcodecs where the C call is missing."""

from __future__ import annotations

import threading

import numcodecs
import numpy as np
import pytest

from pipeline.writers import blosc_into as bi
from pipeline.writers import zarr_direct


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.integers(0, 2_000, 50_001).astype(np.int32),
        (np.floor(rng.exponential(2.0, 30_000)) + 1).astype(np.float32),
        rng.random(7_777),  # float64
        rng.integers(0, 255, 999).astype(np.uint8),
        np.zeros(0, np.int32),
    ]


@pytest.mark.parametrize("cname", ["lz4", "zstd", "blosclz"])
@pytest.mark.parametrize("shuffle", [0, 1, 2])
@pytest.mark.parametrize("blocksize", [0, 4096])
def test_same_bytes_as_numcodecs(cname: str, shuffle: int, blocksize: int) -> None:
    for a in _arrays():
        typesize = a.dtype.itemsize
        ref = numcodecs.Blosc(cname, 5, shuffle, blocksize, typesize=typesize)
        into = bi.blosc_into(cname, 5, shuffle, blocksize, typesize)
        assert into is not None
        raw = a.view(np.uint8)
        assert bytes(into.encode(raw)) == ref.encode(raw), (a.dtype, a.size)


def test_the_buffer_is_reused_and_per_thread() -> None:
    into = bi.blosc_into("lz4", 5, 1, 0, 4)
    assert into is not None
    a, b = (np.arange(n, dtype=np.int32).view(np.uint8) for n in (10_000, 9_000))
    first, second = into.encode(a), into.encode(b)
    assert np.shares_memory(np.asarray(first), np.asarray(second))  # one buffer, written over
    theirs: list[memoryview] = []
    t = threading.Thread(target=lambda: theirs.append(into.encode(a)))
    t.start()
    t.join()
    assert not np.shares_memory(np.asarray(theirs[0]), np.asarray(second))
    assert bytes(theirs[0]) == numcodecs.Blosc("lz4", 5, 1, 0, typesize=4).encode(a)


def test_without_the_c_call_the_writer_keeps_numcodecs(monkeypatch: pytest.MonkeyPatch) -> None:
    conf = {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "blocksize": 0, "typesize": 4}
    assert isinstance(getattr(zarr_direct._blosc(conf), "__self__", None), bi.BloscInto)
    monkeypatch.setattr(bi, "_compress_ctx", lambda: None)
    enc = zarr_direct._blosc(conf)
    raw = np.arange(1_000, dtype=np.int32).view(np.uint8)
    assert isinstance(enc(raw), bytes)  # numcodecs' encode
    assert enc(raw) == numcodecs.Blosc("lz4", 5, 1, 0, typesize=4).encode(raw)
