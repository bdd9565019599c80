"""One process opens a dataset and reads one epoch of a split, then says its wall and CPU
(its own and its children's: the decoder process): for whole-process A/B timings with
two checkouts run in turn (A B A B, e.g. each under ``/usr/bin/time -v``), where start-up
costs count.

    python -m benchmarks.experiments.loader.one_epoch DATASET [--split val] [--batch-size 256]
"""

from __future__ import annotations

import argparse
import gc
import resource
import time

from loaders import ShardDataset, ShardLoader


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--split", default="val")
    ap.add_argument("--batch-size", type=int, default=256)
    a = ap.parse_args(argv)
    t = time.perf_counter()
    ds = ShardDataset(a.dataset, split=a.split, batch_size=a.batch_size, seed=0)
    batches = sum(1 for _ in ShardLoader(ds))
    wall = time.perf_counter() - t
    del ds
    gc.collect()  # the dataset's decoder process (if any) ends with it and counts as a child
    time.sleep(0.3)
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(
        f"{batches} batches; open + epoch {wall:.3f} s wall; CPU {me.ru_utime + me.ru_stime:.2f} s"
        f" here, {kids.ru_utime + kids.ru_stime:.2f} s in child processes"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
