"""The subcommands of `shardsmith`: a registry, name -> module, so that adding one is one line here
and one module beside this file (a modality adds its own from its build module: perturbation's
``export``).

Each module defines ``COMMAND = Command(...)``: its one-line help, a function that adds its
arguments (every argument with a help text) and a function that runs it and returns the exit
code. Modules import their heavy dependencies inside ``run``: building the parser imports every
command module, and `shardsmith --help` must stay instant (and the pipeline must never import
torch: tests/modalities/perturbation/test_build_contents.py).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from loaders.plugins import load_build_modalities
from loaders.plugins.registry import Registry

# name -> module defining COMMAND
COMMANDS: Registry[str] = Registry("command", discover=load_build_modalities)
for _name in ("build", "verify", "inspect", "report", "gc", "demo", "push", "schema"):
    COMMANDS.register(_name, f"pipeline.commands.{_name}")
ORDER = (
    "build",
    "verify",
    "inspect",
    "gc",
)  # `shardsmith --help` lists these first, the rest by name


@dataclass(frozen=True)
class Command:
    """One subcommand: ``configure`` adds its arguments to its parser, ``run`` returns the exit
    code."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str = ""  # longer text for `shardsmith NAME --help` (default: ``help``)


def get_command(name: str) -> Command:
    module = COMMANDS.get(name)
    cmd = importlib.import_module(module).COMMAND
    if not isinstance(cmd, Command):
        raise TypeError(f"{module}.COMMAND is not a pipeline.commands.Command")
    return cmd


def command_names() -> list[str]:
    """Every command, in the order `shardsmith --help` lists them."""
    names = COMMANDS.names()
    return [n for n in ORDER if n in names] + [n for n in names if n not in ORDER]
