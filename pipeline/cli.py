"""`shardsmith build|verify|inspect|demo` (also `python -m pipeline ...`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from loaders.format import FormatError
from pipeline.errors import EXIT_BAD_INPUT, ShardsmithError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardsmith", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or incrementally rebuild) a shard dataset from a manifest")
    b.add_argument("manifest", type=Path)
    b.add_argument("--out", type=Path, default=None, help="output folder (default: shards/<dataset name>)")
    b.add_argument("--jobs", type=int, default=None, help="parallel tasks (default: all cores)")
    b.add_argument("--backend", default="threading", choices=["threading", "loky", "dask", "ray"],
                   help="threading (default: no worker start-up, one copy of the plan), loky processes, dask, ray")
    b.add_argument("--scheduler", default=None, help="dask scheduler / ray cluster address")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    b.add_argument("--format", choices=["zarr", "tar"], default=None, help="override the manifest's [dataset] format")
    b.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="if another build holds --out, wait up to SECONDS for it (default: fail at once, exit 3)")
    g = sub.add_parser("gc", help="remove what no live generation of a dataset names (leftovers of killed builds)")
    g.add_argument("dir", type=Path)
    g.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="wait up to SECONDS for a running build")
    g.add_argument("--drop-previous", action="store_true",
                   help="also remove the previous generation's files (readers still on it must reopen)")
    v = sub.add_parser("verify", help="re-hash and check every shard; exit 0 iff the dataset is sound")
    v.add_argument("dir", type=Path)
    v.add_argument("--no-hash", action="store_true", help="skip content hashes (schema, counts, references only)")
    i = sub.add_parser("inspect", help="records per split, vocabularies, bytes, compression, pairing fallbacks")
    i.add_argument("dir", type=Path)
    i.add_argument("--json", action="store_true")
    d = sub.add_parser("demo", help="write the small demo sources that data_manifests/demo.toml reads")
    d.add_argument("dir", type=Path)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    try:
        if args.command == "build":
            from pipeline.build import build
            from pipeline.verify import format_summary, summary

            res = build(args.manifest, args.out, args.jobs, args.backend, args.scheduler,
                        progress=not args.no_progress, encoding=args.format, wait=args.wait)
            print(f"built {res.out}: {len(res.written)} shards written, {len(res.reused)} reused "
                  f"in {res.seconds['total']:.1f}s")
            print(format_summary(summary(res.out)))
        elif args.command == "verify":
            from pipeline.verify import verify

            problems = verify(args.dir, check_hashes=not args.no_hash)
            for msg in problems:
                print(f"FAIL {msg}", file=sys.stderr)
            print(f"{args.dir}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
            return 0 if not problems else 1
        elif args.command == "inspect":
            from pipeline.verify import format_summary, summary

            s = summary(args.dir)
            print(json.dumps(s, indent=1) if args.json else format_summary(s))
        elif args.command == "gc":
            from pipeline.gc import gc

            removed = gc(args.dir, args.wait, args.drop_previous)
            print(f"gc {args.dir}: {len(removed)} removed" + "".join(f"\n  {f}" for f in removed))
        elif args.command == "demo":
            from pipeline.demo import write_demo

            for path in write_demo(args.dir):
                print(f"wrote {path}")
    except (ShardsmithError, FormatError) as e:
        print(f"error: {e}", file=sys.stderr)
        return int(getattr(e, "exit_code", EXIT_BAD_INPUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
