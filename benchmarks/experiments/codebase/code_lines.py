"""Code lines of a package, per subpackage: the lines that hold Python tokens, without docstrings,
comments and blank lines (the count issue 49 uses for ``loaders/``: 7,451 at 91ae666).

    python -m benchmarks.experiments.codebase.code_lines loaders
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


def main(argv: list[str] | None = None) -> int:
    root = Path((argv if argv is not None else sys.argv[1:] or ["loaders"])[0])
    counts = per_subpackage(root)
    for name, n in sorted(counts.items()):
        print(f"{name:12s} {n:6d}")
    print(f"{'total':12s} {sum(counts.values()):6d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
