"""Cost of planning one batch (which window segments it reads): ``batch_segments`` (a rank's
contiguous slice: every epoch laid out on its own world, as before elastic resume) against
``runs_segments(slice_runs(...))`` (a share of a global batch, :mod:`loaders.epoch.elastic`: only a
resumed epoch on another world), on the 200k screen's shape (160k train cells, 2 windows, 256-cell
batches, one rank). Every batch is planned once, so this is the whole per-batch cost elastic
resume adds to a resumed epoch; the gather itself is unchanged.

    python -m benchmarks.plan_cost
"""

from __future__ import annotations

import timeit

from loaders.epoch import elastic, order
from loaders.epoch.schedule import batch_segments, runs_segments

N, BATCH, BATCHES = 160_296, 256, 600


def main() -> int:
    bounds = [0, N // 2, N]
    per = order.rank_size(N, 1, True)

    def before() -> None:
        for j in range(BATCHES):
            batch_segments(bounds, per, 0, BATCH, j)

    def after() -> None:
        for j in range(BATCHES):
            runs_segments(bounds, elastic.slice_runs(N, 1, BATCH, 1, 0, j, True))

    for name, fn in (("batch_segments", before), ("runs_segments(slice_runs)", after)):
        best = min(timeit.repeat(fn, number=5, repeat=7)) / (5 * BATCHES)
        print(f"{name}: {best * 1e6:.1f} us a batch (best of 7)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
