"""docs/RELIABILITY.md cannot drift: it is the generated text of the hostile-case registry, and
every case in the registry names a test that exists and runs it (``@hostile.parametrize``)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from tests import hostile
from tests.reliability_table import DOC, POINTS, main, render

TESTS = Path(__file__).resolve().parents[1]


def test_reliability_doc_is_the_generated_table() -> None:
    assert DOC.read_text() == render(hostile.all_cases()), "run: python -m tests.reliability_table"


def test_case_ids_are_unique_and_valid() -> None:
    cases = hostile.all_cases()
    assert cases
    twice = [i for i, n in Counter(c.id for c in cases).items() if n > 1]
    assert not twice, f"case ids used twice: {twice}"
    bad = [
        c.id
        for c in cases
        if not hostile.ID.match(c.id) or c.point not in POINTS or "::" not in c.test
    ]
    assert not bad, f"malformed cases: {bad}"


def _decorated(tree: ast.Module) -> set[str]:
    """Module-level test functions decorated with ``hostile.parametrize``."""
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(
            ast.unparse(d) in ("hostile.parametrize", "parametrize") for d in node.decorator_list
        )
    }


def test_every_case_names_a_test_that_runs_it() -> None:
    missing = []
    modules: dict[str, list[Path]] = {}  # module names are unique in tests/: one path each
    for path in TESTS.rglob("test_*.py"):
        modules.setdefault(path.stem, []).append(path)
    decorated: dict[Path, set[str]] = {}
    for case in hostile.all_cases():
        module, fn = case.test.split("::")
        paths = modules.get(module, [])
        if len(paths) == 1 and paths[0] not in decorated:
            decorated[paths[0]] = _decorated(ast.parse(paths[0].read_text()))
        if len(paths) != 1 or fn not in decorated[paths[0]]:
            missing.append(f"{case.id}: {case.test}")
    assert not missing, f"cases whose test does not exist or lacks @hostile.parametrize: {missing}"


def test_check_mode_reports_a_stale_doc(
    tmp_path: Path, monkeypatch: object, capsys: object
) -> None:
    import tests.reliability_table as rt

    stale = tmp_path / "RELIABILITY.md"
    stale.write_text(render(hostile.all_cases()).replace("| `", "| `x", 1))
    monkeypatch.setattr(rt, "DOC", stale)  # type: ignore[attr-defined]
    assert main(["--check"]) == 1
    assert main([]) == 0 and main(["--check"]) == 0
