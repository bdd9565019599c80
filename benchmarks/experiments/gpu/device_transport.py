"""What a trainer on a GPU gets from the loader, per transport, on a lent GPU node (throwaway-sized:
~15 s).

For ``num_workers`` 0 and 2, windows of ``--epochs`` epochs (shuffled 256-cell batches of
``--data``'s ``cells`` shards: ``benchmarks.device_check --prepare``), rotating through:
``device="cuda"`` with a full device sync per batch (what ``benchmarks.gpu`` reports), with the
consumer stream's sync (the batch is usable), and with none (the training thread's own cost);
host batches copied by the trainer (``.to("cuda", non_blocking=True)`` per tensor,
``pin_memory=True``) with a stream sync and with none; host batches not copied. Three rounds;
JSON lines to stdout and ``--out/rates-LABEL.json``.

Before/after a change of the transport, in one lease, alternating processes (A B A B)::

    git archive BEFORE loaders | tar -x -C .devdata/old
    for r in 1 2; do
      PYTHONPATH=.devdata/old python benchmarks/experiments/gpu/device_transport.py --label old$r --out $OUT
      PYTHONPATH=. python benchmarks/experiments/gpu/device_transport.py --label new$r --out $OUT
    done

(Run as a script path, not with ``-m``: ``-m`` puts the working directory first on ``sys.path``,
and the "old" side would import this checkout's ``loaders`` instead of ``PYTHONPATH``'s.)
``--profile`` adds cProfile and torch.profiler tables of ``device="cuda"`` to
``--out/profile-LABEL.txt``.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path
from typing import Any

CONFIGS = [
    ("cuda", "device", False),
    ("cuda", "stream", False),
    ("cuda", "none", False),
    (None, "stream", True),
    (None, "none", True),
    (None, "none", False),
]


def _loader(data: str, workers: int, device: str | None) -> Any:
    from loaders import ShardDataset, ShardLoader

    ds = ShardDataset(
        f"{data}/cells",
        split="train",
        sample="cells",
        batch_size=256,
        seed=0,
        shuffle=True,
        window=4,
    )
    return ShardLoader(
        ds, num_workers=workers, pin_memory=True, device=device, persistent_workers=workers > 0
    )


def _rate(dl: Any, epochs: int, sync: str, copy: bool, first: int = 1) -> float:
    import torch

    n = 0
    torch.cuda.synchronize()
    t = time.perf_counter()
    for e in range(epochs):
        dl.set_epoch(first + e)
        for b in dl:
            if copy:
                b = {
                    k: (v.to("cuda", non_blocking=True) if isinstance(v, torch.Tensor) else v)
                    for k, v in b.items()
                }
            if sync == "device":
                torch.cuda.synchronize()
            elif sync == "stream":
                torch.cuda.current_stream().synchronize()
            n += 1
    torch.cuda.synchronize()
    return n * 256 / (time.perf_counter() - t)


def rates(data: str, label: str, epochs: int, rounds: int = 3) -> list[dict[str, Any]]:
    out = []
    for w in (0, 2):
        loaders = {dev: _loader(data, w, dev) for dev in ("cuda", None)}
        for dl in loaders.values():
            dl.set_epoch(0)
            list(dl)  # warm: decode, workers' start, allocator caches
        for rnd in range(rounds):
            for dev, sync, copy in CONFIGS:
                r = _rate(loaders[dev], epochs, sync, copy)
                out.append(
                    {
                        "code": label,
                        "num_workers": w,
                        "loader": dev or "host",
                        "sync": sync,
                        "trainer_copies": copy,
                        "round": rnd,
                        "cells_per_s": round(r),
                    }
                )
                print(json.dumps(out[-1]), flush=True)
        del loaders
    return out


def profile(data: str, label: str) -> str:
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    buf = io.StringIO()
    for w in (0, 2):
        dl = _loader(data, w, "cuda")
        dl.set_epoch(0)
        list(dl)
        p = cProfile.Profile()
        p.enable()
        r = _rate(dl, 4, "none", False)
        p.disable()
        print(
            f"== {label} num_workers={w}, no per-batch sync: {r:,.0f} cells/s (under cProfile)",
            file=buf,
        )
        pstats.Stats(p, stream=buf).sort_stats("tottime").print_stats(30)
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _rate(dl, 1, "none", False)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), file=buf)
        del dl
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", default=".devdata")
    ap.add_argument("--label", default="new")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"rates-{a.label}.json").write_text(json.dumps(rates(a.data, a.label, a.epochs)))
    if a.profile:
        (a.out / f"profile-{a.label}.txt").write_text(profile(a.data, a.label))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
