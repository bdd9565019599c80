"""`shardsmith push LOCAL URL`: upload a dataset folder to object storage (docs/REMOTE.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.commands import Command

if TYPE_CHECKING:
    from pipeline.push import PushResult


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("local", type=Path, help="a dataset folder (the --out of a build)")
    p.add_argument("url", help="the dataset's prefix in object storage, e.g. s3://bucket/prefix/ds")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="if another push holds the prefix, wait up to SECONDS (default: exit 3 at once)",
    )
    p.add_argument("--jobs", type=int, default=8, help="concurrent uploads (default: 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--replace",
        action="store_true",
        help="push even if URL holds another dataset (another name or kind), replacing it; "
        "without it such a push is refused (exit 2) and nothing is changed",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.push import push  # import weight: `shardsmith --help` imports every command

    res = push(
        args.local,
        args.url,
        wait=args.wait,
        progress=not (args.no_progress or args.quiet),
        jobs=args.jobs,
        replace=args.replace,
    )
    print(report(str(args.local), res))
    return 0


def report(local: str, res: PushResult) -> str:
    """The one line a push prints (also after `shardsmith build --out URL`)."""
    return (
        f"pushed {local} to {res.url}: {len(res.uploaded)} objects uploaded "
        f"({res.bytes_uploaded / 1e6:.1f} MB), {res.unchanged} unchanged, "
        f"{len(res.deleted)} deleted in {res.seconds:.1f}s"
    )


COMMAND = Command(
    help="upload a dataset folder to object storage (s3://...), index.json last",
    configure=configure,
    run=run,
    description="Upload a committed dataset folder to an object-storage prefix: the objects the "
    "remote lacks or holds with other content first, index.json last (the commit point). "
    "The previous pushed generation stays for readers still on it and goes at the next push; "
    "objects no push of this dataset wrote are never deleted. One push per prefix at a time "
    "(a lock object): another exits 3, or waits with --wait. Credentials and endpoint come from "
    "the AWS environment (docs/REMOTE.md).",
)
