"""Micro-benchmark (pytest-benchmark): Blosc chunk compression through numcodecs (a fresh bytes
object per chunk) against pipeline.writers.blosc_into (numcodecs' own C call into a reused
buffer), on chunks shaped like a shard's columns. Both give the same bytes (asserted); the
timings are figures, never asserted (`make bench-micro` prints them side by side).

Recorded verdict (8 MiB chunks, lz4 level 5, shuffle, one thread; docs/PIPELINE.md): 7.4 against
6.1 ms of CPU a chunk, 1.21x, so the zarr writer uses the reused buffer.
"""

from __future__ import annotations

from typing import Any

import numcodecs
import numpy as np
import pytest

from pipeline.memory import release_freed_memory
from pipeline.writers.blosc_into import blosc_into

pytestmark = pytest.mark.bench  # a benchmark, out of the default lanes

ROWS = 2_097_152  # entries a chunk: 8 MiB of int32 or float32


def shard_like_chunks(rows: int = ROWS, seed: int = 0) -> list[np.ndarray]:
    """Column indices (int32, sorted within runs of ~100) and counts (float32), as a shard holds."""
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.integers(0, 2_000, (rows // 100, 100)), axis=1).astype(np.int32).ravel()
    vals = (np.floor(rng.exponential(2.0, rows)) + 1).astype(np.float32)
    return [idx.view(np.uint8), vals.view(np.uint8)]


@pytest.fixture(scope="module")
def chunks() -> list[np.ndarray]:
    numcodecs.blosc.set_nthreads(1)
    release_freed_memory()  # the build's allocator settings
    return shard_like_chunks()


def encoders() -> dict[str, Any]:
    into = blosc_into("lz4", 5, 1, 0, 4)
    assert into is not None, "numcodecs' extension does not export blosc_compress_ctx"
    ref = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1, blocksize=0, typesize=4)
    return {"numcodecs": ref.encode, "reused-buffer": lambda c: bytes(into.encode(c))}


def test_both_paths_give_the_same_bytes(chunks: list[np.ndarray]) -> None:
    enc = encoders()
    for c in chunks:
        assert enc["numcodecs"](c) == enc["reused-buffer"](c)


@pytest.mark.parametrize("path", ["numcodecs", "reused-buffer"])
def test_blosc_chunk(benchmark: Any, chunks: list[np.ndarray], path: str) -> None:
    encode = encoders()[path]
    benchmark.group = "blosc: 8 MiB chunks, lz4 5, shuffle"
    out = benchmark.pedantic(lambda: [encode(c) for c in chunks], rounds=5, iterations=1)
    assert len(out) == len(chunks) and all(len(b) > 0 for b in out)
