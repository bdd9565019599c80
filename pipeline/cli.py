"""`shardsmith <command>` (also `python -m pipeline ...`): global options, logging, exit codes, and
quiet exits on a closed pipe. The subcommands themselves live in :mod:`pipeline.commands` (a
registry).

Exit codes: those of :mod:`pipeline.errors` (0 ok, 1 crash, 2 bad input, 3 lock held; ``verify``
exits 1 when it finds problems), and 141 (the shell's status for SIGPIPE) when the reader of our
output went away (`... | head`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from loaders.format import FormatError
from loaders.plugins import TRUST_ENV, PluginError
from pipeline import __version__
from pipeline.commands import command_names, get_command
from pipeline.errors import EXIT_BAD_INPUT, ShardsmithError

DESCRIPTION = (
    "Build shard datasets from a manifest, check and inspect them, export a split to AnnData. "
    "Also `python -m pipeline ...`. Exit codes: 0 ok, 1 crash, 2 bad input, 3 lock held."
)
OUR_LOGGERS = (
    "pipeline",
    "loaders",
)  # -v turns these to DEBUG; libraries (numcodecs, zarr, ...) stay at WARNING
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a process killed by SIGPIPE


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """-v/-q on the main parser and on every subcommand, so they work before or after the command
    name. On the subcommands the default is SUPPRESS: an absent flag there must not reset one
    given before."""
    kw = {"default": argparse.SUPPRESS} if suppress else {"default": False}
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug messages from shardsmith's own modules (library debug logs stay off)",
        **kw,
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="only warnings and errors on stderr; no progress bars",
        **kw,
    )
    parser.add_argument(
        "--trust-plugins",
        action="store_true",
        help="import the plug-in modules the dataset's index.json names (`plugins`) even when "
        "they are not installed shardsmith modalities: importing runs their code, so only for "
        f"a dataset you trust (as ${TRUST_ENV}=1; docs/EXTENDING.md)",
        **kw,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="shardsmith",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="`shardsmith COMMAND --help` describes a command's arguments.",
    )
    _global_options(p, suppress=False)
    p.add_argument(
        "-V",
        "--version",
        action="version",
        version=f"shardsmith {__version__}",
        help="print it, exit 0",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", help="one of:")
    for name in command_names():
        cmd = get_command(name)
        c = sub.add_parser(name, help=cmd.help, description=cmd.description or cmd.help)
        cmd.configure(c)
        _global_options(c, suppress=True)
    return p


def configure_logging(verbose: bool, quiet: bool) -> None:
    """Our loggers at INFO (DEBUG with -v, WARNING with -q); everything else at WARNING, whatever -v
    says."""
    logging.basicConfig(
        level=logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s" if verbose else "%(levelname)s %(message)s",
    )
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    for name in OUR_LOGGERS:
        logging.getLogger(name).setLevel(level)


def _silence_stdout() -> None:
    """The reader closed the pipe: point stdout at /dev/null so that the interpreter's final flush
    does not print a second BrokenPipeError (the recipe of Python's `signal` documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (e.g. captured by a test)
        pass


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except PluginError as e:  # an installed modality's module is missing: commands need it
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    args.verbose, args.quiet = (
        bool(getattr(args, "verbose", False)),
        bool(getattr(args, "quiet", False)),
    )
    if args.verbose and args.quiet:
        print("error: -v and -q contradict each other", file=sys.stderr)
        return EXIT_BAD_INPUT
    configure_logging(args.verbose, args.quiet)
    if getattr(args, "trust_plugins", False):  # inherited by what the command starts
        os.environ[TRUST_ENV] = "1"
    try:
        code = get_command(args.command).run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except (ShardsmithError, FormatError, PluginError) as e:  # PluginError: a plug-in is missing
        print(f"error: {e}", file=sys.stderr)
        return int(getattr(e, "exit_code", EXIT_BAD_INPUT))  # e.g. 3 for a held lock


if __name__ == "__main__":
    sys.exit(main())
