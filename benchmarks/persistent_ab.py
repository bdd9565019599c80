"""ShardLoader(num_workers=W) with default settings against the same loader with
``persistent_workers=True`` (and ``False``, torch's default and ours before issue 26 item 5), in ONE
process, interleaved (:mod:`benchmarks.interleaved`'s streams and windows), so the VM's drift
cancels out of the ratios.

    python -m benchmarks.persistent_ab SHARDS_ROOT [--seconds 3] [--rounds 5] [--workers 2] [--reverse]

Every stream is an endless chain of epochs (``set_epoch`` each), so an epoch's start-up (workers
spawned, their first window) is paid as often as a trainer pays it. Prints one JSON object: each
stream's cells/s (median of its windows) and, per round, its ratio to ``persistent_workers=True``
and to ``num_workers=0``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from typing import Any

from benchmarks.interleaved import Stream
from benchmarks.measure import EpochChain


def loader_stream(root: str, workers: int, **kw: Any) -> Stream:
    from loaders import ShardDataset, ShardLoader  # after argument parsing: torch is slow to load

    ds = ShardDataset(root, split="train", sample="cells", batch_size=256, seed=0)
    dl = ShardLoader(ds, num_workers=workers, **kw)

    def epoch(e: int) -> Iterator[Any]:
        dl.set_epoch(e)
        return iter(dl)

    name = f"w={workers} " + (" ".join(f"{k}={v}" for k, v in kw.items()) or "default")
    return Stream(name, lambda: EpochChain(epoch), {"num_workers": workers, **kw})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reverse", action="store_true", help="take turns in the reverse order")
    a = ap.parse_args(argv)
    streams = [
        loader_stream(a.root, a.workers),
        loader_stream(a.root, a.workers, persistent_workers=True),
        loader_stream(a.root, a.workers, persistent_workers=False),
        loader_stream(a.root, 0),
    ]
    for s in streams:
        s.start(2)
    turns = streams[::-1] if a.reverse else streams  # a stream's place in a round can bias it
    for _ in range(a.rounds):
        for s in turns:
            s.window(a.seconds)
    persistent, zero = streams[1], streams[3]
    out = {"seconds": a.seconds, "rounds": a.rounds, "streams": []}
    for s in streams:
        out["streams"].append(
            {
                "method": s.name,
                "cells_per_s": statistics.median(s.windows),
                "epochs": getattr(s.it, "epochs", 0),
                "vs_persistent": statistics.median(
                    x / y for x, y in zip(s.windows, persistent.windows, strict=True)
                ),
                "vs_w0": statistics.median(
                    x / y for x, y in zip(s.windows, zero.windows, strict=True)
                ),
            }
        )
    for s in streams:
        close = getattr(s.it, "close", None)
        if close is not None:
            close()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
