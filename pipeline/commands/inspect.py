"""`shardsmith inspect DIR`: what a dataset holds, as text or JSON."""

from __future__ import annotations

import argparse
import json

from pipeline.commands import Command


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir",
        help="a built dataset folder (holding index.json and shards/), or its URL (s3://...)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the whole summary as JSON (full vocabularies included) instead of text",
    )


def run(args: argparse.Namespace) -> int:
    from loaders.remote.resolve import fetch_dataset  # import weight: `--help` stays instant
    from pipeline.verify import (  # import weight: `shardsmith --help` imports every command module
        format_summary,
        summary,
    )

    s = summary(fetch_dataset(args.dir, shards=False)[0])  # a URL: its index.json only
    print(json.dumps(s, indent=1) if args.json else format_summary(s))
    return 0


COMMAND = Command(
    help="records and units per split, vocabularies, bytes, compression, pairing fallbacks",
    configure=configure,
    run=run,
)
