"""`shardsmith verify DIR`: re-hash and check every shard."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.commands import Command
from pipeline.errors import DatasetError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="a built dataset folder (holding index.json and shards/)")
    p.add_argument(
        "--no-hash",
        action="store_true",
        help="skip content hashes (schema, counts, references only)",
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.verify import (
        verify,  # import weight: `shardsmith --help` imports every command module
    )

    if not (args.dir / "index.json").is_file():
        # no dataset to find problems in: a wrong path is bad input (2), not a damaged dataset (1)
        what = (
            "does not exist"
            if not args.dir.exists()
            else "is not a folder"
            if not args.dir.is_dir()
            else "holds no index.json"
        )
        raise DatasetError(
            f"{args.dir} {what}: pass a dataset folder (the --out of `shardsmith build`)"
        )
    problems = verify(args.dir, check_hashes=not args.no_hash)
    for msg in problems:
        print(f"FAIL {msg}", file=sys.stderr)
    print(f"{args.dir}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 0 if not problems else 1


COMMAND = Command(
    help="re-hash and check every shard; exit 0 iff the dataset is sound, 1 if it has problems, "
    "2 if DIR holds no dataset",
    configure=configure,
    run=run,
)
