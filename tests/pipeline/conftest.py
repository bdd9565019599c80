"""Fixtures of the pipeline tests (tests/pipeline/): fresh interpreters of this checkout, for locks
and kills."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


# -- processes of this checkout -----------------------------------------------------------------
@dataclass(frozen=True)
class Checkout:
    """Fresh interpreters importing this checkout: real processes, for locks and kills."""

    root: Path = ROOT
    env: dict[str, str] = field(default_factory=lambda: dict(ENV))

    def python(
        self, code: str, *args: str, check: bool = False, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a fresh interpreter."""
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.root,
            check=check,
            timeout=timeout,
        )

    def popen(self, code: str, *args: str) -> subprocess.Popen[str]:
        return self._popen("-c", code, *args)

    def cli(self, *args: str) -> subprocess.Popen[str]:
        """`shardsmith ARGS` as its own process."""
        return self._popen("-m", "pipeline", *args)

    def _popen(self, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.root,
        )


@pytest.fixture(scope="session")
def checkout() -> Checkout:
    """Fresh interpreters importing this checkout: ``.python(code, *args)``, ``.popen``, ``.cli``,
    ``.root``, ``.env``."""
    return Checkout()
