"""`shardsmith export DIR OUT.h5ad --split val`: one split as AnnData
(pipeline/modalities/perturbation/export.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from loaders.format.errors import FormatError
from pipeline.commands import Command


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir",
        help="a built perturbation dataset folder (holding index.json and shards/), or its URL "
        "(s3://...: the split's shards fetched into the node cache, docs/REMOTE.md)",
    )
    p.add_argument(
        "out", type=Path, help="the .h5ad file to write (replaced atomically if it exists)"
    )
    p.add_argument("--split", required=True, help="which split to export: train, val or test")
    p.add_argument(
        "--sample",
        default="cells",
        choices=["cells", "pairs", "sentences"],
        help="cells (default): the split's cells, each once; pairs/sentences: every cell their units "
        "use, matched controls included (obs column 'primary' tells which)",
    )


def run(args: argparse.Namespace) -> int:
    from loaders.remote.resolve import fetch_dataset  # import weight: `--help` stays instant
    from pipeline.modalities.perturbation.export import (
        export,
    )  # import weight: `shardsmith --help` stays instant

    root, problems = fetch_dataset(args.dir, splits=[args.split])
    if problems:
        raise FormatError("; ".join(problems))
    out = export(root, args.split, args.out, args.sample)
    print(f"wrote {out}")
    return 0


COMMAND = Command(
    help="write one split as an AnnData .h5ad (X, obs labels, var, obsm['cond']) for scanpy",
    configure=configure,
    run=run,
)
