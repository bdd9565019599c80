"""`shardsmith build MANIFEST`: build, or incrementally rebuild, a shard dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands import Command


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "manifest", type=Path, help="the dataset's TOML manifest (e.g. data_manifests/demo.toml)"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="output folder (default: shards/<dataset name>)"
    )
    p.add_argument("--jobs", type=int, default=None, help="parallel tasks (default: all cores)")
    p.add_argument(
        "--backend",
        default="threading",
        choices=["threading", "loky", "dask", "ray"],
        help="threading (default: no worker start-up, one copy of the plan), loky processes, dask, ray",
    )
    p.add_argument("--scheduler", default=None, help="dask scheduler / ray cluster address")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--format",
        choices=["zarr", "tar"],
        default=None,
        help="override the manifest's [dataset] format",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="if another build holds --out, wait up to SECONDS for it (default: fail at once, exit 3)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="scan and plan only: print the shards that would be written, reused and deleted (and "
        "their bytes); change nothing",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="build even if --out holds another dataset (another [dataset] name or kind), "
        "replacing it; without it such a build is refused (exit 2) and nothing is changed",
    )
    p.add_argument(
        "--log-json",
        default=None,
        metavar="FILE",
        help="append one JSON object per event to FILE ('-': stderr); the last is the summary",
    )


def run(args: argparse.Namespace) -> int:
    """The build, its report, and a last stdout line that is the JSON summary (pipeline.events)."""
    from pipeline.events import (
        reported,  # import weight: `shardsmith --help` imports every command module
    )

    with reported(args.log_json, args.out) as report:
        report.result = _build(args, report.events)
    return 0


def _build(args: argparse.Namespace, events: object) -> object:
    from pipeline.build import (
        build,  # import weight: `shardsmith --help` imports every command module
    )
    from pipeline.verify import (  # import weight: `shardsmith --help` imports every command module
        format_summary,
        summary,
    )

    res = build(
        args.manifest,
        args.out,
        args.jobs,
        args.backend,
        args.scheduler,
        progress=not (args.no_progress or args.quiet),
        encoding=args.format,
        dry_run=args.dry_run,
        events=events,
        wait=args.wait,
        replace=args.replace,
    )  # type: ignore[arg-type]
    if res.difference is not None:
        print("\n".join([f"dry run of {res.out}: nothing was changed", *res.difference.lines()]))
        return res
    print(
        f"built {res.out}: {len(res.written)} shards written, {len(res.reused)} reused "
        f"in {res.seconds['total']:.1f}s"
    )
    print(format_summary(summary(res.out)))
    return res


COMMAND = Command(
    help="build (or incrementally rebuild) a shard dataset from a manifest",
    configure=configure,
    run=run,
)
