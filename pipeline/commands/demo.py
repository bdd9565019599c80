"""`shardsmith demo DIR`: the small demo sources that the demo manifests read."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands import Command


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path, help="folder to write the demo sources into (data_manifests/ reads data/demo)")


def run(args: argparse.Namespace) -> int:
    from pipeline.demo import write_demo

    for path in write_demo(args.dir):
        print(f"wrote {path}")
    return 0


COMMAND = Command(help="write the small demo sources that data_manifests/demo*.toml read", configure=configure,
                  run=run)
