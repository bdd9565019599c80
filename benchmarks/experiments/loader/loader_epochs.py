"""Dense-cells loader throughput of one checkout, for A/B runs of two checkouts as whole processes.

    for i in 1 2 3 4 5 6; do
        /usr/bin/time -f "old %U %S %e" python benchmarks/experiments/loader/loader_epochs.py OLD_CHECKOUT DATASET 6
        /usr/bin/time -f "new %U %S %e" python benchmarks/experiments/loader/loader_epochs.py NEW_CHECKOUT DATASET 6
    done

``CHECKOUT`` goes first on ``sys.path``, so each side imports its own ``loaders``; the dataset is read
the same by both (``num_workers=0``, 256 cells a batch, shuffled, ``EPOCHS`` epochs). Prints cells/s.
"""

from __future__ import annotations

import sys
import time


def main(argv: list[str]) -> int:
    checkout, root = argv[0], argv[1]
    epochs = int(argv[2]) if len(argv) > 2 else 6
    sys.path.insert(0, checkout)
    from loaders import ShardDataset, ShardLoader  # the checkout's own: after the path is set

    ds = ShardDataset(root, split="train", sample="cells", batch_size=256, shuffle=True, seed=0)
    dl = ShardLoader(ds, num_workers=0)
    n, t = 0, time.perf_counter()
    for epoch in range(epochs):
        dl.set_epoch(epoch)
        for batch in dl:
            n += int(batch["X"].shape[0])
    print(f"{n / (time.perf_counter() - t):.0f} cells/s", checkout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
