"""`shardsmith demo DIR`: the small demo sources that the demo manifests read."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from loaders.plugins import load_build_modalities
from loaders.plugins.registry import Registry
from pipeline.commands import Command

# modality -> "module:function" writing its demo sources under a root folder (registered by the
# modality)
DEMO_WRITERS: Registry[str] = Registry("demo writer", discover=load_build_modalities)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir",
        type=Path,
        help="folder to write the demo sources into (data_manifests/ reads data/demo)",
    )


def write_demo(root: str | Path) -> list[Path]:
    """The demo corpus every data_manifests/demo*.toml reads: each modality's demo writer, in name
    order."""
    paths: list[Path] = []
    for name in DEMO_WRITERS.names():
        module, func = DEMO_WRITERS.get(name).split(":")
        paths += getattr(importlib.import_module(module), func)(root)
    return paths


def run(args: argparse.Namespace) -> int:
    for path in write_demo(args.dir):
        print(f"wrote {path}")
    return 0


COMMAND = Command(
    help="write the small demo sources that data_manifests/demo*.toml read",
    configure=configure,
    run=run,
)
