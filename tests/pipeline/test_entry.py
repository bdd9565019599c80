"""The command's process set-up (pipeline.entry): one BLAS thread unless the user says otherwise,
set before numpy loads (OpenBLAS reads it once, at numpy's import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs a command entry in a fresh interpreter and prints what OPENBLAS_NUM_THREADS was when numpy
# was first imported (an import hook sees it before numpy's own code runs).
PROBE = """
import importlib.abc, json, os, runpy, sys
seen = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and "numpy" not in seen:
            seen["numpy"] = os.environ.get("OPENBLAS_NUM_THREADS")
        return None
sys.meta_path.insert(0, Watch())
sys.argv = ["shardsmith", "--version"]
try:
    if ENTRY == "module":
        runpy.run_module("pipeline", run_name="__main__")
    else:
        from pipeline.entry import main
        main()
except SystemExit:
    pass
print(json.dumps(seen), file=sys.stderr)
"""


def _seen(entry: str, env_value: str | None) -> dict[str, str | None]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if env_value is not None:
        env["OPENBLAS_NUM_THREADS"] = env_value
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", f"ENTRY = {entry!r}\n{PROBE}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.process
@pytest.mark.parametrize("entry", ["module", "script"])
def test_one_blas_thread_before_numpy_loads(entry: str) -> None:
    """`python -m pipeline` and the `shardsmith` script both set it before numpy is imported."""
    assert _seen(entry, None) == {"numpy": "1"}


@pytest.mark.process
def test_the_users_setting_wins() -> None:
    assert _seen("script", "4") == {"numpy": "4"}


def test_the_script_is_the_entry() -> None:
    """pyproject's console script goes through the set-up, not straight to the CLI."""
    text = (ROOT / "pyproject.toml").read_text()
    assert 'shardsmith = "pipeline.entry:main"' in text
