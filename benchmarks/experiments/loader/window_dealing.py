"""Prototype for issue 24 item 4: deal *windows* to DataLoader workers (each worker decodes its own
windows, no decoder process, no broker) against today's engine (batches dealt round-robin, every
window decoded once by the rank's decoder process and mapped by every worker through the broker),
in ONE process, interleaved (:mod:`benchmarks.interleaved`'s streams), with ``X[idx].toarray()``
and ``num_workers=0`` as references.

    python -m benchmarks.experiments.loader.window_dealing SHARDS_ROOT H5AD [--window 2] [--seconds 3] [--rounds 5]

The prototype (:class:`WindowDealt`) gives worker ``w`` of ``W`` the batches whose first window is
``w`` mod ``W``; it decodes those windows itself (and the next one ahead, in a thread), assembles
and ships runs of batches through the same ring as today. Its batches are today's batches, but
the DataLoader's round-robin over workers interleaves windows, so **the order a rank yields
depends on ``num_workers``** (and a batch straddling two windows decodes the second one again
in another worker). Prints one JSON object: cells/s per stream (median of its windows) and the
ratios, per round, to today's engine, to ``num_workers=0`` and to the scipy baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from itertools import islice
from typing import Any

from torch.utils.data import get_worker_info

from benchmarks.interleaved import Stream, scipy_dense
from benchmarks.measure import EpochChain, load_csr
from loaders.dataset import ShardDataset
from loaders.engine.ring import worker_ring
from loaders.engine.transport import to_shared
from loaders.epoch import order


class WindowDealt(ShardDataset):
    """A ShardDataset whose DataLoader workers own whole windows (see module docstring)."""

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        shipping = self.settings.shipping
        if info is None or shipping is None:
            yield from super().__iter__()
            return
        epoch, start = self.plan.iteration()
        wstarts = order.window_bounds(self.counts, self.seed, epoch, self.window, self.shuffle)[1]
        plan_of = self._plans(epoch, wstarts)
        mine = [
            j
            for j in range(start, self.num_batches(epoch))
            if plan_of(j)[1][0] % info.num_workers == info.id
        ]
        engine = self.engine_here()
        engine.broker_address = None  # decode here: no broker, no decoder process
        self.decode_process = False
        served = engine.serve(epoch, iter(mine), info.id, info.num_workers)
        ring = worker_ring(shipping.ring_slots)
        while chunk := list(islice(served, shipping.batches)):
            yield to_shared(chunk, self.settings.output, ring)


def stream(root: str, window: int, workers: int, dealt: bool) -> Stream:
    from loaders import ShardLoader  # with the dataset: importing here keeps --help fast

    cls = WindowDealt if dealt else ShardDataset
    kw = {"decode_process": False} if dealt else {}  # dealt: its workers decode, nobody else
    ds = cls(root, split="train", sample="cells", batch_size=256, seed=0, window=window, **kw)
    dl = ShardLoader(ds, num_workers=workers)

    def epoch(e: int) -> Iterator[Any]:
        dl.set_epoch(e)
        return iter(dl)

    name = f"{'windows dealt' if dealt else 'today'} w={workers}"
    return Stream(name, lambda: EpochChain(epoch), {"num_workers": workers, "dealt": dealt})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("root")
    ap.add_argument("h5ad")
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    x = load_csr(a.h5ad)
    base = Stream("scipy X[idx].toarray()", lambda: EpochChain(scipy_dense(x, 256)), {})
    streams = [
        base,
        stream(a.root, a.window, 0, False),
        stream(a.root, a.window, a.workers, False),
        stream(a.root, a.window, a.workers, True),
    ]
    for s in streams:
        s.start(2)
    for _ in range(a.rounds):
        for s in streams:
            s.window(a.seconds)
    today = streams[2]
    out: dict[str, Any] = {"window": a.window, "seconds": a.seconds, "rounds": a.rounds}
    rows = []
    for s in streams:
        rows.append(
            {
                "method": s.name,
                "cells_per_s": statistics.median(s.windows),
                "epochs": getattr(s.it, "epochs", 0),
                **{
                    f"vs_{ref}": statistics.median(
                        a_ / b_ for a_, b_ in zip(s.windows, r.windows, strict=True)
                    )
                    for ref, r in (("scipy", base), ("w0", streams[1]), ("today", today))
                },
            }
        )
    out["streams"] = rows
    for s in streams:
        close = getattr(s.it, "close", None)
        if close is not None:
            close()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
