"""`shardsmith build MANIFEST`: build, or incrementally rebuild, a shard dataset."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from pipeline.commands import Command


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "manifest", type=Path, help="the dataset's TOML manifest (e.g. data_manifests/demo.toml)"
    )
    p.add_argument(
        "--out",
        type=_out,
        default=None,
        help="output folder (default: shards/<dataset name>), or an s3:// prefix: build in a local "
        "staging folder (--stage), then push there (docs/REMOTE.md)",
    )
    p.add_argument(
        "--stage",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --out s3://...: the local folder to build in, kept between runs so that a "
        "rebuild reuses its shards (default: a folder per URL under ~/.cache/shardsmith/stage)",
    )
    p.add_argument("--jobs", type=int, default=None, help="parallel tasks (default: all cores)")
    p.add_argument(
        "--backend",
        default="threading",
        choices=["threading", "loky", "dask", "ray"],
        help="threading (default: no worker start-up, one copy of the plan), loky processes, dask, ray",
    )
    p.add_argument("--scheduler", default=None, help="dask scheduler / ray cluster address")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--format",
        choices=["zarr", "tar"],
        default=None,
        help="override the manifest's [dataset] format",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="if another build holds --out, wait up to SECONDS for it (default: fail at once, exit 3)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="scan and plan only: print the shards that would be written, reused and deleted (and "
        "their bytes); change nothing",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="build even if --out holds another dataset (another [dataset] name or kind), "
        "replacing it; without it such a build is refused (exit 2) and nothing is changed",
    )
    p.add_argument(
        "--rehash",
        action="store_true",
        help="read every source again for its content digest, even those whose size, mtime, "
        "inode and ctime are as the last build recorded them (the stat cache)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the build's JSON summary (status, changed, exit_code, written, reused...) as "
        "the one line of stdout; the human summary then goes to stderr",
    )
    p.add_argument(
        "--log-json",
        default=None,
        metavar="FILE",
        help="append one JSON object per event to FILE ('-': stderr); the last is the summary",
    )


def run(args: argparse.Namespace) -> int:
    """The build and its report. stdout carries what was asked: the JSON summary with ``--json``
    (pipeline.events), else the human summary (none with ``-q``); events go where ``--log-json``
    says."""
    from pipeline.events import (
        reported,  # import weight: `shardsmith --help` imports every command module
    )

    with reported(args.log_json, args.out, stdout=args.json) as report:
        report.result = _build(args, report.events)
    return 0


def _say(args: argparse.Namespace, text: str) -> None:
    """The human summary: on stdout, on stderr with ``--json`` (stdout is the JSON), not at all
    with ``-q``."""
    if not args.quiet:
        print(text, file=sys.stderr if args.json else sys.stdout)


def _out(text: str) -> Path | str:
    """--out: a folder, or an object-storage URL kept as text (a Path would fold its "//")."""
    from loaders.remote.store import is_url  # import weight: only --out needs it, not --help

    return text if is_url(text) else Path(text)


def _build(args: argparse.Namespace, events: object) -> object:
    from pipeline.build import (
        build,  # import weight: `shardsmith --help` imports every command module
    )
    from pipeline.verify import (  # import weight: `shardsmith --help` imports every command module
        format_summary,
        summary,
    )

    url = args.out if isinstance(args.out, str) else None  # an s3:// prefix: stage, then push
    progress = not (args.no_progress or args.quiet)
    res = build(
        args.manifest,
        args.out if url is None else _stage(url, args.stage),
        args.jobs,
        args.backend,
        args.scheduler,
        progress=progress,
        encoding=args.format,
        dry_run=args.dry_run,
        events=events,
        wait=args.wait,
        replace=args.replace,
        rehash=args.rehash,
    )  # type: ignore[arg-type]
    if res.difference is not None:  # what --dry-run asks for: printed even with -q
        lines = [f"dry run of {res.out}: nothing was changed", *res.difference.lines()]
        print("\n".join(lines), file=sys.stderr if args.json else sys.stdout)
        return res
    _say(
        args,
        f"built {res.out}: {len(res.written)} shards written, {len(res.reused)} reused "
        f"in {res.seconds['total']:.1f}s\n{format_summary(summary(res.out))}",
    )
    if url is not None:
        from pipeline.commands.push import report  # import weight: as above
        from pipeline.push import push  # import weight: as above

        pushed = push(res.out, url, wait=args.wait, progress=progress, replace=args.replace)
        _say(args, report(str(res.out), pushed))
    return res


def _stage(url: str, stage: Path | None) -> Path:
    """The local folder a build for ``url`` is staged in: ``--stage``, else one per URL in the
    user's cache, the same on every run (a nightly rebuild then reuses its unchanged shards)."""
    if stage is not None:
        return stage
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    name = url.rstrip("/").rsplit("/", 1)[-1] or "dataset"
    return base / "shardsmith" / "stage" / f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


COMMAND = Command(
    help="build (or incrementally rebuild) a shard dataset from a manifest",
    configure=configure,
    run=run,
)
