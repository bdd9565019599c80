"""Micro-benchmark (pytest-benchmark): planning one batch's window segments as a rank's contiguous
slice (``batch_segments``, an epoch laid out on its own world) against a share of a global batch
(``runs_segments(slice_runs(...))``, loaders.epoch.elastic: only a resumed epoch on another world), on
the 200k screen's shape (160k train cells, 2 windows, 256-cell batches, one rank). Both plan the
same segments (asserted); the timings are figures, never asserted.

Recorded verdict (docs/LOADER.md, elastic resume): 3.2 us a batch against 1.6 us, next to a
batch's ~300-700 us of gather: the elastic plan is kept for resumed epochs only.
"""

from __future__ import annotations

from typing import Any

import pytest

from loaders.epoch import elastic, order
from loaders.epoch.schedule import batch_segments, runs_segments

pytestmark = pytest.mark.bench  # a benchmark, out of the default lanes

N, BATCH, BATCHES = 160_296, 256, 600
BOUNDS = [0, N // 2, N]


def contiguous(j: int) -> Any:
    return batch_segments(BOUNDS, order.rank_size(N, 1, True), 0, BATCH, j)


def global_share(j: int) -> Any:
    return runs_segments(BOUNDS, elastic.slice_runs(N, 1, BATCH, 1, 0, j, True))


PLANS = {"batch_segments": contiguous, "runs_segments(slice_runs)": global_share}


def test_one_rank_plans_the_same_segments_both_ways() -> None:
    for j in (0, (N // 2) // BATCH, BATCHES - 1):  # the first, one crossing the windows, the last
        assert contiguous(j) == global_share(j)


@pytest.mark.parametrize("name", list(PLANS))
def test_plan_batches(benchmark: Any, name: str) -> None:
    plan = PLANS[name]
    benchmark.group = f"plan {BATCHES} batches of {BATCH} cells"
    benchmark.pedantic(lambda: [plan(j) for j in range(BATCHES)], rounds=7, iterations=5)
