"""benchmarks/README.md names every module of the suite, and benchmarks/experiments/ANALYSIS.md every
experiment with its verdict: a module nobody can find is a module nobody runs or removes. Neither
names a module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
EXPERIMENTS = BENCH / "experiments"


def named(doc: Path) -> set[str]:
    """Every ``name.py`` the document's table rows name (rows start with a backticked module)."""
    rows = [line for line in doc.read_text().splitlines() if line.startswith("| `")]
    return {m for row in rows for m in re.findall(r"`([\w]+\.py)`", row.split("|")[1])}


def modules(folder: Path, recursive: bool) -> set[str]:
    files = folder.rglob("*.py") if recursive else folder.glob("*.py")
    return {p.name for p in files if p.name != "__init__.py"}


def test_the_readme_names_every_module_of_the_suite() -> None:
    missing = modules(BENCH, recursive=False) - named(BENCH / "README.md")
    assert not missing, f"benchmarks/README.md does not name: {sorted(missing)}"


def test_the_experiments_analysis_names_every_experiment() -> None:
    missing = modules(EXPERIMENTS, recursive=True) - named(EXPERIMENTS / "ANALYSIS.md")
    assert not missing, f"benchmarks/experiments/ANALYSIS.md does not name: {sorted(missing)}"


def test_no_module_named_is_gone() -> None:
    gone = named(BENCH / "README.md") - modules(BENCH, recursive=False)
    gone |= named(EXPERIMENTS / "ANALYSIS.md") - modules(EXPERIMENTS, recursive=True)
    assert not gone, f"named but not in benchmarks/: {sorted(gone)}"
