"""`shardsmith gc DIR`: remove what no live generation of a dataset names."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands import Command


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="a dataset folder (the --out of a build)")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="if a build holds the folder, wait up to SECONDS for it (default: fail at once, exit 3)",
    )
    p.add_argument(
        "--drop-previous",
        action="store_true",
        help="also remove the previous generation's files (loaders still reading it must reopen)",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.gc import gc  # import weight: `shardsmith --help` imports every command module

    removed = gc(args.dir, args.wait, args.drop_previous)
    print(f"gc {args.dir}: {len(removed)} removed" + "".join(f"\n  {f}" for f in removed))
    return 0


COMMAND = Command(
    help="remove leftovers of killed builds and files no live generation names (never others')",
    configure=configure,
    run=run,
    description="Remove from a dataset folder what no live generation names: files of builds "
    "killed before their commit, their spill folders and temp files, an interrupted "
    "cleanup's retired files. Keeps the current and the previous generation (a loader "
    "may still read it) and every file shardsmith did not write.",
)
