"""The subcommands of `shardsmith`: a registry, name -> module, so that adding one is one line here and one
module beside this file.

Each module defines ``COMMAND = Command(...)``: its one-line help, a function that adds its arguments (every
argument with a help text) and a function that runs it and returns the exit code. Modules import their heavy
dependencies inside ``run``: building the parser imports every command module, and `shardsmith --help` must
stay instant (and the pipeline must never import torch: tests/test_pipeline.py).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass

# name -> module defining COMMAND, in the order `shardsmith --help` lists them
COMMAND_MODULES: dict[str, str] = {
    "build": "pipeline.commands.build",
    "verify": "pipeline.commands.verify",
    "inspect": "pipeline.commands.inspect",
    "gc": "pipeline.commands.gc",
    "export": "pipeline.commands.export",
    "demo": "pipeline.commands.demo",
}


@dataclass(frozen=True)
class Command:
    """One subcommand: ``configure`` adds its arguments to its parser, ``run`` returns the exit code."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str = ""  # longer text for `shardsmith NAME --help` (default: ``help``)


def get_command(name: str) -> Command:
    if name not in COMMAND_MODULES:
        raise ValueError(f"unknown command {name!r} (known: {sorted(COMMAND_MODULES)})")
    cmd = importlib.import_module(COMMAND_MODULES[name]).COMMAND
    if not isinstance(cmd, Command):
        raise TypeError(f"{COMMAND_MODULES[name]}.COMMAND is not a pipeline.commands.Command")
    return cmd
