"""The CLI guides: help on every argument, -v/-q anywhere, only our debug logs, vocabularies in
`inspect`, quiet exits on a closed pipe, `--version`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline import __version__
from pipeline.cli import main, parser
from tests import hostile

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]
) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("cli")
    manifest = build_dataset(
        tmp, "manifest", sources=1, cells=300, genes=40, perts=30, source_name="s{i}.h5ad"
    ).manifest
    assert main(["build", str(manifest), "--out", str(tmp / "out"), "--jobs", "1", "-q"]) == 0
    return tmp / "out", manifest


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices  # noqa: SLF001


def test_every_argument_has_help() -> None:
    p = parser()
    missing = [
        f"{name}: {a.dest}"
        for name, sub in [("shardsmith", p), *_subparsers(p).items()]
        for a in sub._actions
        if not a.help
    ]  # noqa: SLF001
    assert not missing, missing


@pytest.mark.parametrize(
    "argv", [["-v", "inspect", "D"], ["inspect", "D", "-v"], ["inspect", "-v", "D"]]
)
def test_verbose_anywhere(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    assert args.verbose is True and not args.quiet


def test_quiet_before_and_verbose_after_are_both_seen() -> None:
    args = parser().parse_args(["-q", "inspect", "D"])
    assert args.quiet is True and args.verbose is False
    assert (
        main(["-q", "inspect", "D", "-v"]) == 2
    )  # contradictory: refused, not silently one of them


@pytest.mark.process
def test_verbose_debugs_only_our_loggers(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, manifest = built
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            str(manifest),
            "--out",
            str(tmp_path / "o"),
            "--jobs",
            "1",
            "--no-progress",
            "-v",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    debug = [line for line in res.stderr.splitlines() if line.startswith("DEBUG")]
    assert all(line.split()[1].startswith(("pipeline", "loaders")) for line in debug), debug[:5]


def test_verbose_levels_in_process(
    built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = built
    assert main(["inspect", str(out), "-v"]) == 0
    assert logging.getLogger("pipeline.build").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("numcodecs").isEnabledFor(logging.DEBUG)
    assert main(["-q", "inspect", str(out)]) == 0
    assert not logging.getLogger("loaders.dataset").isEnabledFor(logging.INFO)
    assert main(["inspect", str(out)]) == 0
    assert logging.getLogger("pipeline").isEnabledFor(logging.INFO)


def test_inspect_prints_vocabularies_truncated(
    built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = built
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    vocab = json.loads((out / "index.json").read_text())["vocabularies"]
    line = next(x for x in text.splitlines() if x.strip().startswith("perturbation ("))
    assert line.strip().startswith(
        f"perturbation ({len(vocab['perturbation'])}): {vocab['perturbation'][0]}, "
    )
    assert f"(+{len(vocab['perturbation']) - line.count(',')} more)" in line and len(line) <= 110
    assert (
        f"cell_type ({len(vocab['cell_type'])}): {', '.join(vocab['cell_type'])}" in text
    )  # short: all shown
    assert main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["vocabularies"] == vocab


@pytest.mark.process
def test_closed_pipe_exits_quietly(built: tuple[Path, Path]) -> None:
    """`shardsmith inspect DIR --json | head -0`: no BrokenPipeError traceback, the shell's SIGPIPE
    status."""
    out, _ = built
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "inspect", str(out), "--json"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader goes away before the first write
    code, err = proc.wait(timeout=60), proc.stderr.read().decode()
    assert err == "" and code == 141, (code, err)


@pytest.mark.process
@hostile.parametrize
def test_version(case: hostile.Case) -> None:
    """A bug report starts with the version: ``shardsmith --version`` prints it and exits 0."""
    res = subprocess.run(
        [sys.executable, "-m", "pipeline", "--version"], capture_output=True, text=True, env=ENV
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"shardsmith {__version__}\n"
