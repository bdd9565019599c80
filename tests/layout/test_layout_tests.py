"""Test modules share their builders through fixtures (tests/conftest.py and the plug-in it
registers, tests/plugin_fixtures.py), never by importing one another: a tests/test_*.py module
imports no module of tests/ but the plug-in modules listed in ALLOWED. Every import statement
counts, function-local and ``if TYPE_CHECKING:`` ones included (found with ``ast``; code inside
strings is not looked at).
"""

from __future__ import annotations

import ast
import functools
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.name  # "tests"

# modules of tests/ that test modules may import: plug-ins and registries, not shared builders
ALLOWED = {
    "tests.plugin_toy": "a fake third-party modality (kind, source, sample type) manifests name",
    "tests.hostile": "the hostile-case registry: @hostile.parametrize, the rows of RELIABILITY.md",
    "tests.reliability_table": "writes docs/RELIABILITY.md (python -m tests.reliability_table)",
}
# imports still to remove, in modules being edited by others: (importing module, imported module).
# The last test fails once one is gone, so that its entry (and the module it kept alive) go too.
PENDING: dict[tuple[str, str], str] = {}


def _resolve(name: str, level: int, package: str) -> str:
    """The absolute name of ``from <level dots><name> import ...`` inside ``package``."""
    if not level:
        return name
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([name] if name else []))


@functools.cache
def _local_names() -> frozenset[str]:
    """Bare names of tests/ modules and folders (walked once: every test module asks)."""
    product = {p.name for p in TESTS.parent.iterdir() if (p / "__init__.py").is_file()}
    local = {p.stem for p in TESTS.rglob("*.py")} | {p.name for p in TESTS.iterdir() if p.is_dir()}
    return frozenset(local - product)  # tests/pipeline/ is no bare name: ``import pipeline`` is the product


def imported_tests_modules(source: str, package: str = PACKAGE) -> set[str]:
    """Every module of the tests package that ``source`` (a module of it) imports, by absolute name.
    A bare name that is a module of tests/ (``import conftest``, ``from test_x import y``, with
    tests/ on sys.path) counts as that module."""
    local = _local_names()
    found: set[str] = set()

    def add(module: str) -> None:
        head = module.split(".")[0]
        if head == package:
            found.add(module)
        elif head in local:
            found.add(f"{package}.{module}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node.module or "", node.level, package)
            if module == package:  # from tests import hostile: the names are modules
                for alias in node.names:
                    add(f"{package}.{alias.name}")
            else:
                add(module)
    return found


def _allowed(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ALLOWED)


def _violations() -> dict[tuple[str, str], str]:
    """(test module, tests module it imports) -> the file, for every import not allowed."""
    found = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        name = ".".join((PACKAGE, *path.relative_to(TESTS).with_suffix("").parts))
        for module in imported_tests_modules(path.read_text()):
            if module != name and not _allowed(module):
                found[(path.stem, module)] = str(path.relative_to(TESTS))
    return found


def test_no_test_module_imports_another_tests_module() -> None:
    bad = sorted(
        f"{file} imports {module}"
        for (stem, module), file in _violations().items()
        if (stem, module) not in PENDING
    )
    assert not bad, (
        "shared builders and helpers reach tests as fixtures (tests/conftest.py, "
        f"tests/plugin_fixtures.py), not by import: {bad}"
    )


def test_allowed_modules_are_plug_ins_that_exist() -> None:
    for module in ALLOWED:
        rel = Path(*module.split(".")[1:])
        assert (TESTS / f"{rel}.py").is_file() or (TESTS / rel / "__init__.py").is_file(), module
        assert not rel.name.startswith("test_") and rel.name not in ("conftest", "plugin_fixtures")


def test_the_check_sees_every_form_of_import() -> None:
    """The checker itself, on every form of import (one inside a string: not looked at), in a
    package named "pkg" here (so that this text is no import of tests/ for a grep either)."""
    source = textwrap.dedent("""
      import os, pkg.a
      import pkg.b.c as c
      from pkg import d, hostile
      from pkg.e import f
      from . import g
      from .h import i
      from .. import elsewhere
      import conftest
      from test_loader import x
      from typing import TYPE_CHECKING
      if TYPE_CHECKING:
          from pkg.j import K
      def fn():
          from pkg.k import m
      SCRIPT = "from pkg.not_code import n"
    """)
    assert imported_tests_modules(source, package="pkg") == {
        "pkg.a",
        "pkg.b.c",
        "pkg.d",
        "pkg.hostile",
        "pkg.e",
        "pkg.g",
        "pkg.h",
        "pkg.conftest",
        "pkg.test_loader",
        "pkg.j",
        "pkg.k",
    }


def test_pending_imports_are_still_there() -> None:
    """An entry of PENDING whose import is gone is deleted, with what it kept alive."""
    gone = sorted(
        f"{stem} -> {module}: {todo}"
        for (stem, module), todo in PENDING.items()
        if (stem, module) not in _violations()
    )
    assert not gone, f"remove from PENDING (tests/layout/test_layout_tests.py): {gone}"


def pytestmark_assignments(source: str) -> int:
    """How many module-level statements assign ``pytestmark``."""
    return sum(
        1
        for node in ast.parse(source).body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and any(
            isinstance(t, ast.Name) and t.id == "pytestmark"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    )


def test_a_module_sets_pytestmark_once() -> None:
    """A second ``pytestmark = ...`` replaces the first: a module marked ``s3`` that later sets a
    warning filter the same way runs in the fast lane. One list holds every module-level mark."""
    twice = [
        str(p.relative_to(TESTS))
        for p in sorted(TESTS.rglob("test_*.py"))
        if pytestmark_assignments(p.read_text()) > 1
    ]
    assert not twice, f"pytestmark set more than once (the last one wins): {twice}"
    assert pytestmark_assignments("pytestmark = 1\nx = 2\npytestmark = [3]\n") == 2


def marks_of_module(source: str) -> set[str]:
    """The marker names of a module's ``pytestmark`` (``pytest.mark.X`` or a list of them)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute):
                    if sub.value.attr == "mark":
                        names.add(sub.attr)
    return names


def test_every_benchmark_test_module_is_marked_bench() -> None:
    """`make test-fast` skips tests/benchmarks unread (`--ignore`: importing the harness costs
    seconds of collection per worker); that selects what `-m "not bench"` would only while every
    module there is marked ``bench`` as a whole."""
    unmarked = [
        p.name
        for p in sorted((TESTS / "benchmarks").glob("test_*.py"))
        if "bench" not in marks_of_module(p.read_text())
    ]
    assert not unmarked, f"tests/benchmarks modules without pytestmark = pytest.mark.bench: {unmarked}"
    assert marks_of_module("import pytest\npytestmark = [pytest.mark.s3, pytest.mark.bench]\n") == {
        "s3",
        "bench",
    }
