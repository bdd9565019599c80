"""Every ```python and ```bash block of README.md and docs/*.md runs as written.

How: in a scratch folder holding a copy of data_manifests/, a ``.venv/bin`` whose ``shardsmith``
and ``python`` are this interpreter with this checkout on PYTHONPATH, the bash blocks of
README.md run first (they write the demo sources and build the demo shards the other snippets
read), then every doc's blocks in order: bash with ``bash -e``; python in one namespace per doc,
except a block opening with a docstring ``'''python NAME.py ARGS ...'''`` (with double quotes),
which is a script: written to NAME.py and run with ARGS.

README.md's python blocks run apart from that
(``test_readme_python_runs_on_what_make_shards_built``): each block alone (a reader copies one
block, not the page) in a folder where the Makefile's own ``shards`` recipe ran (make, with this
interpreter as its python and no install step), for the demo manifests the blocks read: what a new
user has after the README's two set-up commands.

A block that cannot run here (it needs a GPU, a cluster, a download) says so where a reader sees
it, on the line right above it: ``*(Not run by the docs test: REASON.)*``. A doc whose blocks
only run together with files the test must write first has its own test, listed in OWN_TEST.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import hostile

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# a dataset `make shards` writes: shards/<demo manifest>-<format>
MADE = re.compile(r"""["']shards/(?P<manifest>\w+?)-(?P<format>zarr|tar)["']""")
OWN_TEST = {
    "EXTENDING.md": "tests/docs/test_docs_extending.py",  # a plug-in module, its manifest, commands
    "PERTURBATION.md": "tests/docs/test_docs_perturbation.py",
}  # manifest + experiment files, then Python
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in OWN_TEST),
]
SKIP = re.compile(r"^\*\(Not run by the docs test: (?P<reason>.+?)\.?\)\*\s*$")
FENCE = re.compile(r"^```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)^```\s*$", re.S | re.M)
HOW = (
    "fix the block, or, if it cannot run on a CPU-only test machine, put this line right above it: "
    "*(Not run by the docs test: REASON.)*"
)
SCRIPT = re.compile(r'^"""python (?P<name>[\w.-]+\.py)(?P<args>[^"\n]*?)(?:\s{2,}|\s*\(|""")')


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    body: str
    skip: str | None  # the visible reason, when the doc marks the block as not run


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        if m.group("lang") not in ("python", "bash"):
            continue
        before = text[: m.start()].rstrip("\n").splitlines()
        marker = SKIP.match(before[-1]) if before else None
        out.append(
            Block(
                path.name,
                len(before) + 1,
                m.group("lang"),
                m.group("body"),
                marker.group("reason") if marker else None,
            )
        )
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("docs")
    (work / "data_manifests").mkdir()
    for p in (ROOT / "data_manifests").glob("*.toml"):
        (work / "data_manifests" / p.name).write_text(p.read_text())
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, args in (
        ("python", ""),
        ("shardsmith", " -m pipeline"),
    ):  # scripts: a venv's python is found by path
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)}{args} "$@"\n')
        shim.chmod(0o755)
    for b in blocks(ROOT / "README.md"):
        if b.lang == "bash" and b.skip is None:
            _run_bash(b, work)
    return work


def _run_bash(b: Block, cwd: Path) -> None:
    env = _env()
    env["PATH"] = f"{cwd / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    res = subprocess.run(
        ["bash", "-e", "-c", b.body], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, (
        f"{b.doc}:{b.line} (bash) exited {res.returncode}; {HOW}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    )


def _run_script(b: Block, m: re.Match[str], cwd: Path) -> None:
    (cwd / m.group("name")).write_text(b.body)
    args = shlex.split(m.group("args"))
    res = subprocess.run(
        [sys.executable, m.group("name"), *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, (
        f"{b.doc}:{b.line} ({m.group('name')}) exited {res.returncode}; {HOW}\n{res.stderr[-3000:]}"
    )


@pytest.mark.process
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_doc_snippets_run(doc: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    todo = [b for b in blocks(doc) if b.skip is None]
    if not todo:
        pytest.skip(f"{doc.name}: no runnable python/bash block")
    monkeypatch.chdir(workdir)
    namespace: dict[str, object] = {"__name__": f"docs_{doc.stem.lower()}"}
    for b in todo:
        if b.lang == "python" and doc == README:
            continue  # each alone, on what `make shards` built: the test below
        if b.lang == "bash":
            if (
                doc.name != "README.md"
            ):  # README's ran in the fixture (the data everything else reads)
                _run_bash(b, workdir)
            continue
        script = SCRIPT.match(b.body)
        if script:
            _run_script(b, script, workdir)
            continue
        try:
            exec(compile(b.body, f"{doc.name}:{b.line}", "exec"), namespace)  # noqa: S102 - the doc's own snippet
        except Exception as e:
            raise AssertionError(
                f"{doc.name}:{b.line} (python) raised {type(e).__name__}: {e}; {HOW}"
            ) from e


@pytest.fixture(scope="module")
def made_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where the Makefile's ``shards`` recipe ran, as ``make shards`` runs it (the same
    manifests, the same --out names), for the demo manifests README's python blocks read (fewer
    builds); ``-o`` skips the install step and ``PY`` is this interpreter."""
    work = tmp_path_factory.mktemp("make_shards")
    shutil.copytree(ROOT / "data_manifests", work / "data_manifests")
    demos = sorted(
        {m["manifest"] for b in blocks(README) if b.lang == "python" for m in MADE.finditer(b.body)}
    )  # none: README reads other names, and the test shows what they raise after the full recipe
    res = subprocess.run(
        ["make", "-f", str(ROOT / "Makefile"), "-o", ".venv/.installed", "shards"]
        + [f"PY={sys.executable}", *([f"DEMOS={' '.join(demos)}"] if demos else [])],
        cwd=work,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, f"make shards failed\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return work


@pytest.mark.process
@hostile.parametrize
def test_readme_python_runs_on_what_make_shards_built(
    case: hostile.Case, made_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25, 14: README read shards/demo-perturb while `make shards` writes shards/demo-zarr
    (FormatError: no index.json), and its Lightning block used a ``ds`` from another block. Each
    python block runs alone, in a fresh namespace, where only `make shards` ran."""
    monkeypatch.chdir(made_shards)
    todo = [b for b in blocks(README) if b.lang == "python" and b.skip is None]
    assert todo
    for b in todo:
        for m in MADE.finditer(b.body):
            path = made_shards / "shards" / f"{m['manifest']}-{m['format']}"
            assert (path / "index.json").exists(), f"README.md:{b.line} reads {path.name}"
        namespace: dict[str, object] = {"__name__": "readme_block"}
        try:
            exec(compile(b.body, f"README.md:{b.line}", "exec"), namespace)  # noqa: S102
        except Exception as e:
            raise AssertionError(
                f"README.md:{b.line} (python, run alone after `make shards`) raised "
                f"{type(e).__name__}: {e}; {HOW}"
            ) from e


def test_docs_with_their_own_test_have_it() -> None:
    for doc, test in OWN_TEST.items():
        assert (ROOT / "docs" / doc).exists() and (ROOT / test).exists(), (doc, test)


def test_skipped_blocks_say_why() -> None:
    """The marker is the only way out, and it must carry a reason a reader understands."""
    for doc in DOCS:
        for b in blocks(doc):
            assert b.skip is None or len(b.skip.split()) >= 3, f"{doc.name}:{b.line}: give a reason"


def test_the_extractor_sees_blocks_and_markers(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "text\n\n```python\nx = 1\n```\n\n*(Not run by the docs test: needs a CUDA GPU.)*\n"
        "```bash\nnvidia-smi\n```\n\n```toml\n[a]\n```\n"
    )
    got = blocks(doc)
    assert [(b.lang, b.body, b.skip) for b in got] == [
        ("python", "x = 1\n", None),
        ("bash", "nvidia-smi\n", "needs a CUDA GPU"),
    ]
