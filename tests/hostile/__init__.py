"""The registry of hostile cases: one row of docs/RELIABILITY.md per case, one parametrised test
item per row.

docs/RELIABILITY.md is generated from this registry (``python -m tests.reliability_table``) and
``tests/docs/test_reliability_table.py`` fails when the file differs from the generated text, when two
cases share an id, or when a case names a test that does not exist or is not decorated with
``@hostile.parametrize``. The table therefore lists exactly the cases the suite runs.

How to add a case (three steps):

1. In a module of this package (one per area: ``values.py``, ``build.py``, ``read.py``...; any
module here
   is picked up), add a row to its ``CASES`` list::

       Case("two-writers", point=1, what="two builds into one --out started 0.1 s apart",
            outcome="the second exits 3 at once, naming the holder's pid and host",
            test="test_build_lock::test_second_writer_refused",
            data={"delay": 0.1})          # anything the test needs; not shown in the table

   ``id`` is unique across the registry and becomes the pytest id; ``point`` is the numbered case of
   issue 13 (1-9; 10: a full disk or read-only ``--out``), issue 25's groups (11-16), issue 23
   (17: object storage), 24 (18: resume on another world) or 26.1 (19: digests); titles in
   ``tests/reliability_table.py:POINTS``);
   ``test`` is ``<test module>::<test function>``.
2. Decorate that test function with ``@hostile.parametrize``: it receives every case whose ``test``
names
   it, as the argument ``case`` (use ``case.data``)::

       from tests import hostile

       @hostile.parametrize
       def test_second_writer_refused(case: hostile.Case, tmp_path: Path) -> None: ...

3. Run ``python -m tests.reliability_table`` to rewrite docs/RELIABILITY.md and commit it. A merge
conflict
   in docs/RELIABILITY.md is resolved the same way: take either side, then rerun the generator.

Keep this package free of heavy imports: the table generator imports every module in it.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

F = TypeVar("F", bound=Callable[..., Any])
ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class Case:
    id: str  # unique; the pytest id (lower case, digits, '-', '_', '.')
    # the numbered case of issue 13 it belongs to (1-9; 10: the full-disk bullet of its Deliver
    # list)
    point: int
    what: str  # what the attacker or unlucky operator does (markdown, one line)
    outcome: str  # what happens now: the behaviour the test asserts (markdown, one line)
    test: str  # "<test module>::<test function>" that runs it
    data: Any = field(default=None, compare=False)  # whatever the test needs; not in the table


def all_cases() -> list[Case]:
    """Every registered case, from every module of this package, in (point, id) order."""
    cases: list[Case] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        cases += list(getattr(importlib.import_module(f"{__name__}.{info.name}"), "CASES", []))
    return sorted(cases, key=lambda c: (c.point, c.id))


def cases_for(test: str) -> list[Case]:
    return [c for c in all_cases() if c.test == test]


def parametrize(fn: F) -> F:
    """Run ``fn`` once per case whose ``test`` is this function (argument ``case``); none is an
    error."""
    key = f"{fn.__module__.rsplit('.', 1)[-1]}::{fn.__name__}"
    cases = cases_for(key)
    if not cases:
        raise LookupError(f"no hostile case names {key!r} (tests/hostile/*.py)")
    return pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in cases])(fn)
