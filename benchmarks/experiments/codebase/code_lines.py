"""Code lines of a package, per subpackage: the lines that hold Python tokens, without docstrings,
comments and blank lines (the count issue 49 uses for ``loaders/``: 7,451 at 91ae666), or of a
named group of files: ``config``, the modules that parse a manifest (issue 48's "configuration
parsing", target at most 700).

    python -m benchmarks.experiments.codebase.code_lines loaders
    python -m benchmarks.experiments.codebase.code_lines --group config
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import Counter
from pathlib import Path

SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
# named groups of files, relative to the repository root
GROUPS: dict[str, tuple[str, ...]] = {
    # what reads and checks a manifest's tables: the schema, the generic part, each kind's sections.
    # Not in it (not parsing): the [[sources]] files found on disk (pipeline/source_files.py), the
    # cell-load experiment file's reader (perturbation/experiment.py), the spike column-codec table
    # (spike/codecs.py), what index.json records of [split] and [ct] (the kinds' split_section,
    # settings_json); 912 code lines at 4db365a counted source_files.py, 694 at the end of the round.
    "config": (
        "pipeline/schema.py",
        "pipeline/manifest.py",
        "pipeline/modalities/perturbation/config.py",
        "pipeline/modalities/perturbation/split_config.py",
        "pipeline/modalities/ct/settings.py",
        "pipeline/modalities/spike/config.py",
    ),
}
REPO = Path(__file__).resolve().parents[3]


def code_lines(path: Path) -> int:
    src = path.read_text()
    docs: set[int] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, DOCUMENTED) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in SKIP and tok.type != tokenize.ENDMARKER:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docs)


def per_subpackage(root: Path) -> Counter[str]:
    """``(top)`` for the package's own modules, else the subpackage's name."""
    out: Counter[str] = Counter()
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        out[rel[0] if len(rel) > 1 else "(top)"] += code_lines(p)
    return out


def per_file(files: tuple[str, ...]) -> dict[str, int]:
    return {f: code_lines(REPO / f) for f in files}


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:] or ["loaders"]
    if args[0] == "--group":
        counts: dict[str, int] = per_file(GROUPS[args[1]])
    else:
        counts = dict(sorted(per_subpackage(Path(args[0])).items()))
    width = max(12, *map(len, counts))
    for name, n in counts.items():
        print(f"{name:{width}s} {n:6d}")
    print(f"{'total':{width}s} {sum(counts.values()):6d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
