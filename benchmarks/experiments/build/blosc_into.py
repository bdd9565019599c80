"""Blosc chunk compression two ways, interleaved in one process: ``numcodecs.Blosc.encode`` (a
fresh bytes object per chunk) against `pipeline.writers.blosc_into` (numcodecs' own C call into a
reused buffer), under the build's 1 MiB mmap threshold (`pipeline.memory`). Same bytes (checked),
CPU per chunk, median of the rounds' ratios.

    python -m benchmarks.blosc_into            # 8 MiB int32 / float32 chunks, lz4 level 5, shuffle
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numcodecs
import numpy as np

from pipeline.memory import release_freed_memory
from pipeline.writers.blosc_into import blosc_into


def chunks(rows: int, seed: int = 0) -> list[np.ndarray]:
    """Column indices (int32, sorted within runs of ~100) and counts (float32), as a shard holds."""
    rng = np.random.default_rng(seed)
    idx = [np.sort(rng.integers(0, 2_000, (rows // 100, 100)), axis=1).astype(np.int32).ravel()]
    vals = [(np.floor(rng.exponential(2.0, rows)) + 1).astype(np.float32)]
    return [*idx * 2, *vals * 2]


def per_chunk_ms(
    encode: Callable[[np.ndarray], object], data: list[np.ndarray], reps: int
) -> float:
    t = time.process_time()
    for _ in range(reps):
        for c in data:
            encode(c.view(np.uint8))
    return (time.process_time() - t) / (reps * len(data)) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_097_152, help="entries per chunk (8 MiB)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    numcodecs.blosc.set_nthreads(1)
    release_freed_memory()  # the build's allocator settings
    ref = numcodecs.Blosc(cname="lz4", clevel=5, shuffle=1, blocksize=0, typesize=4)
    into = blosc_into("lz4", 5, 1, 0, 4)
    if into is None:
        print("numcodecs' extension does not export blosc_compress_ctx: nothing to compare")
        return 1
    data = chunks(a.rows)
    for c in data:
        assert ref.encode(c.view(np.uint8)) == bytes(into.encode(c.view(np.uint8)))
    ratios, old, new = [], [], []
    for _ in range(a.rounds):
        old.append(per_chunk_ms(ref.encode, data, a.reps))
        new.append(per_chunk_ms(into.encode, data, a.reps))
        ratios.append(old[-1] / new[-1])
    print(
        f"{a.rows * 4 / 2**20:.0f} MiB chunks, same bytes: numcodecs {statistics.median(old):.2f}"
        f" ms, reused buffer {statistics.median(new):.2f} ms of CPU a chunk (medians); "
        f"numcodecs / reused per round {', '.join(f'{r:.2f}' for r in ratios)}; "
        f"median {statistics.median(ratios):.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
