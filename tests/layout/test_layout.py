"""The house rules of the layout, checked from the code itself: no import cycles among product
modules, generic modules that never name a modality, and each modality's files in its two
folders.

Why tests: the layout decays one convenient import at a time. The import graph counts every
import statement (module level, in functions, under ``TYPE_CHECKING``): an import inside a
function still ties two modules, it only hides the tie from the interpreter until that function
runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from loaders.plugins import modality_modules

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "loaders")


def product_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in packages:
        for p in sorted((root / pkg).rglob("*.py")):
            parts = list(p.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = p
    return mods


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the product modules its import statements name (``from a import b``: ``a.b`` when
    that is a module, else ``a``; relative imports resolved)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
            else:
                continue
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    graph[mod].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_product_modules() -> None:
    found = cycles(import_graph(product_modules()))
    assert not found, "import cycles (every import statement counts):\n" + "\n".join(
        map(" <-> ".join, found)
    )


def test_no_import_cycles_among_benchmark_modules() -> None:
    """The benchmark suite too (benchmarks/ and its experiments): a cycle there hides which module
    a figure comes from as well."""
    found = cycles(import_graph(product_modules(packages=("benchmarks",))))
    assert not found, "import cycles in benchmarks/:\n" + "\n".join(map(" <-> ".join, found))


def modality_words() -> set[str]:
    """What names a modality: each installed modality's name and the kinds and sample types it
    registers (source types are file formats such as ``npy``, which generic code may well name)."""
    from loaders.samples import SAMPLE_TYPES
    from pipeline.model import KINDS

    return {name for name, _ in modality_modules()} | set(KINDS.names()) | set(SAMPLE_TYPES.names())


def generic_modules() -> dict[str, Path]:
    return {
        m: p
        for m, p in product_modules().items()
        if ".modalities" not in m and not m.endswith(".testing")
    }


def code_words(path: Path) -> list[tuple[int, str]]:
    """(line, word) of every identifier, imported name and string literal that is not a docstring."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
        ):
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts = [node.name]
        elif isinstance(node, ast.arg):
            texts = [node.arg]
        elif isinstance(node, ast.keyword):
            texts = [node.arg or ""]
        elif isinstance(node, ast.alias):
            texts = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            texts = [node.module or ""]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            texts = [node.value]
        else:
            continue
        for text in texts:
            out += [(getattr(node, "lineno", 0), w.lower()) for w in re.split(r"[\W_]+", text) if w]
    return out


def test_generic_modules_never_name_a_modality() -> None:
    words = modality_words()
    assert {"perturbation", "spike", "ct", "cells"} <= words  # the built-ins are found
    hits = [
        f"{p.relative_to(ROOT)}:{line}: {w}"
        for p in generic_modules().values()
        for line, w in code_words(p)
        if w in words
    ]
    assert not hits, (
        "generic modules naming a modality (move the code into its modality):\n" + "\n".join(hits)
    )


def test_the_modality_check_sees_a_modality_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""A docstring may say spike."""\nfrom loaders.modalities.spike import ops\nKIND = "ct"\n'
    )
    assert {w for _, w in code_words(bad)} >= {"spike", "ct"}
    assert "spike" not in {w for line, w in code_words(bad) if line == 1}


@pytest.mark.parametrize(
    "name", [name for name, _ in modality_modules() if name in ("perturbation", "spike", "ct")]
)
def test_a_built_in_modality_lives_in_its_two_folders(name: str) -> None:
    """Files named after a built-in modality sit only in ``pipeline/modalities/<m>/`` and
    ``loaders/modalities/<m>/``, and both folders exist."""
    homes = [ROOT / "pipeline" / "modalities" / name, ROOT / "loaders" / "modalities" / name]
    assert all(h.is_dir() for h in homes)
    stray = [
        p
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if re.search(rf"(^|_){name}(_|$)", p.stem) and not any(h in p.parents for h in homes)
    ]
    assert not stray, f"{name} files outside its folders: {stray}"


def test_built_in_modalities_are_found_without_entry_point_metadata(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A checkout used through PYTHONPATH (no ``pip install``: no entry points) still finds the
    built-ins."""
    import loaders.plugins as plugins

    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    plugins.modality_modules.cache_clear()
    try:
        names = {name for name, _ in plugins.modality_modules()}
    finally:
        plugins.modality_modules.cache_clear()
    assert {"perturbation", "spike", "ct"} <= names


def function_local_imports_without_reason(path: Path) -> list[int]:
    """Lines of imports inside functions with no comment on them or on the line above."""
    text = path.read_text()
    lines, tree = text.splitlines(), ast.parse(text)
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                span = lines[node.lineno - 1 : node.end_lineno]
                above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                if not any("#" in s for s in span) and not above.startswith("#"):
                    found.append(node.lineno)
    return sorted(set(found))


def test_function_local_imports_say_why() -> None:
    """An import inside a function hides a dependency until the function runs: allowed for an
    optional extra or import weight, and then the line says which."""
    bare = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in product_modules().values()
        for n in function_local_imports_without_reason(p)
    ]
    assert not bare, "function-local imports without a reason comment:\n" + "\n".join(bare)


def test_the_reason_check_sees_a_bare_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import json\n\n\ndef g():\n    import os  # import weight\n")
    assert function_local_imports_without_reason(bad) == [2]


# -- the loader's layers ---------------------------------------------------------------------------
LOADERS = ROOT / "loaders"
TOP_MODULES_AT_MOST = 12  # the public face: dataset, loader, options, lightning, testing, shims


def loader_layer(mod: str, mods: dict[str, Path]) -> str | None:
    """The layer a ``loaders`` module belongs to: ``loaders.<subpackage>``, or ``loaders`` for the
    modules at the top (the public face, ``__init__`` included); None outside ``loaders``."""
    if mod.split(".")[0] != "loaders":
        return None
    rel = mods[mod].relative_to(LOADERS)
    return f"loaders.{rel.parts[0]}" if len(rel.parts) > 1 else "loaders"


def layer_edges(
    graph: dict[str, set[str]], mods: dict[str, Path]
) -> dict[tuple[str, str], list[str]]:
    """(layer, layer it imports) -> the import statements' ``module -> module`` that make the edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for a, targets in graph.items():
        for b in targets:
            la, lb = loader_layer(a, mods), loader_layer(b, mods)
            if la and lb and la != lb:
                edges.setdefault((la, lb), []).append(f"{a} -> {b}")
    return edges


def both_ways(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    return [
        f"{a} <-> {b}: {edges[(a, b)]} / {edges[(b, a)]}"
        for (a, b) in sorted(edges)
        if a < b and (b, a) in edges
    ]


def test_loader_layers_form_a_dag() -> None:
    """The top of ``loaders/`` and its subpackages (format, plugins, epoch, samples, engine, remote,
    modalities): no import between two of them runs both ways, counting every import statement."""
    mods = product_modules()
    edges = layer_edges(import_graph(mods), mods)
    assert ("loaders", "loaders.engine") in edges  # the check sees the layers
    bad = both_ways(edges)
    assert not bad, "imports both ways between loader layers:\n" + "\n".join(bad)


def test_the_layer_check_sees_an_import_running_back_up(tmp_path: Path) -> None:
    mods = {
        "loaders": LOADERS / "__init__.py",
        "loaders.dataset": LOADERS / "dataset.py",
        "loaders.engine.window": LOADERS / "engine" / "window.py",
    }
    graph = {
        "loaders": set(),
        "loaders.dataset": {"loaders.engine.window"},
        "loaders.engine.window": {"loaders.dataset"},
    }
    assert both_ways(layer_edges(graph, mods))
    graph["loaders.engine.window"] = set()
    assert not both_ways(layer_edges(graph, mods))


def test_the_top_of_loaders_is_the_public_face_only() -> None:
    top = sorted(p.stem for p in LOADERS.glob("*.py") if p.stem != "__init__")
    assert len(top) <= TOP_MODULES_AT_MOST, top
