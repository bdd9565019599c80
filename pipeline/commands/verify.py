"""`shardsmith verify DIR`: re-hash and check every shard."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.commands import Command


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

    problems = verify(args.dir, check_hashes=not args.no_hash)
    for msg in problems:
        print(f"FAIL {msg}", file=sys.stderr)
    print(f"{args.dir}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 0 if not problems else 1


COMMAND = Command(
    help="re-hash and check every shard; exit 0 iff the dataset is sound",
    configure=configure,
    run=run,
)
