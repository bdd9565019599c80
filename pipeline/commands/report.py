"""`shardsmith report DATASET`: one offline HTML page of what a dataset holds, with its figures'
data as JSON and a MultiQC custom-content file beside it."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.commands import Command
from pipeline.commands.verify import require_dataset


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dir",
        help="a built dataset folder (holding index.json and shards/), or its URL (s3://...: its "
        "shards are fetched into the node cache, docs/REMOTE.md)",
    )
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        default=None,
        help="the page to write (default: DIR.html beside the dataset folder; for a URL, "
        "NAME.html in the current folder); FILE.json and FILE_mqc.json are written beside it",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when the dataset carries warnings (the report is written all the same)",
    )


def default_out(shown: str) -> Path:
    """DIR.html beside a local dataset (never inside it: the folder holds only what the build
    wrote); a URL's last path part + .html in the current folder."""
    name = shown.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    if "://" in shown:
        return Path(f"{name}.html")
    return Path(shown.rstrip("/")).parent / f"{name}.html"


def run(args: argparse.Namespace) -> int:
    from loaders.remote.resolve import fetch_dataset  # import weight: `--help` stays instant
    from pipeline.report.build import (  # import weight: as the line above (the pipeline, numpy)
        build_report,
        check_writable,
        write_report,
    )

    shown = str(args.dir)
    out = args.out if args.out is not None else default_out(shown)
    check_writable(out)
    root, problems = fetch_dataset(shown)
    require_dataset(root)
    for msg in problems:
        print(f"FAIL {msg}")
    report = build_report(root, shown)
    paths = write_report(report, out)
    warnings = report.summary.get("warnings") or []
    print(
        f"wrote {paths[0]} (open it in a browser), {paths[1]} (its figures' data), {paths[2]} (MultiQC)"
    )
    if report.missing:
        print(f"{len(report.missing)} figure(s) this dataset cannot show (the page says why)")
    if warnings:
        print(f"{len(warnings)} warning(s): " + "; ".join(warnings))
    return 1 if (args.strict and warnings) or problems else 0


COMMAND = Command(
    help="write an offline HTML report of a dataset (plots per modality), its data as JSON and a "
    "MultiQC file; --strict exits 1 on warnings",
    configure=configure,
    run=run,
)
