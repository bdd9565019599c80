"""`shardsmith verify DIR`: re-hash and check every shard."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.commands import Command
from pipeline.errors import DatasetError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir",
        help="a built dataset folder (holding index.json and shards/), or its URL (s3://...: "
        "fetched into the node cache, docs/REMOTE.md)",
    )
    p.add_argument(
        "--no-hash",
        action="store_true",
        help="skip content hashes (schema, counts, references only)",
    )


def require_dataset(root: Path) -> None:
    """No dataset to find problems in: a wrong path is bad input (DatasetError, exit 2), not a
    damaged dataset (1). Shared by the commands that read a whole dataset (verify, report)."""
    if not (root / "index.json").is_file():
        what = (
            "does not exist"
            if not root.exists()
            else "is not a folder"
            if not root.is_dir()
            else "holds no index.json"
        )
        raise DatasetError(
            f"{root} {what}: pass a dataset folder (the --out of `shardsmith build`)"
        )


def run(args: argparse.Namespace) -> int:
    from loaders.remote.resolve import fetch_dataset  # import weight: `--help` stays instant
    from pipeline.verify import (
        verify,  # import weight: `shardsmith --help` imports every command module
    )

    shown = args.dir
    args.dir, fetch_problems = fetch_dataset(args.dir)
    require_dataset(args.dir)
    problems = fetch_problems + verify(args.dir, check_hashes=not args.no_hash)
    for msg in problems:
        print(f"FAIL {msg}", file=sys.stderr)
    print(f"{shown}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 0 if not problems else 1


COMMAND = Command(
    help="re-hash and check every shard; exit 0 iff the dataset is sound, 1 if it has problems, "
    "2 if DIR holds no dataset",
    configure=configure,
    run=run,
)
