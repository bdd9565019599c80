"""`shardsmith build MANIFEST`: build, or incrementally rebuild, a shard dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands import Command


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("manifest", type=Path, help="the dataset's TOML manifest (e.g. data_manifests/demo.toml)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: shards/<dataset name>)")
    p.add_argument("--jobs", type=int, default=None, help="parallel tasks (default: all cores)")
    p.add_argument("--backend", default="threading", choices=["threading", "loky", "dask", "ray"],
                   help="threading (default: no worker start-up, one copy of the plan), loky processes, dask, ray")
    p.add_argument("--scheduler", default=None, help="dask scheduler / ray cluster address")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--format", choices=["zarr", "tar"], default=None, help="override the manifest's [dataset] format")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="if another build holds --out, wait up to SECONDS for it (default: fail at once, exit 3)")


def run(args: argparse.Namespace) -> int:
    from pipeline.build import build
    from pipeline.verify import format_summary, summary

    res = build(args.manifest, args.out, args.jobs, args.backend, args.scheduler,
                progress=not (args.no_progress or args.quiet), encoding=args.format, wait=args.wait)
    print(f"built {res.out}: {len(res.written)} shards written, {len(res.reused)} reused "
          f"in {res.seconds['total']:.1f}s")
    print(format_summary(summary(res.out)))
    return 0


COMMAND = Command(help="build (or incrementally rebuild) a shard dataset from a manifest", configure=configure,
                  run=run)
