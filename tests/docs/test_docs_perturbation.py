"""docs/PERTURBATION.md runs as written: its walkthrough's manifest, experiment file and Python
snippet."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import format as fmt

DOC = Path(__file__).resolve().parents[2] / "docs" / "PERTURBATION.md"


def test_cellload_walkthrough_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_all: Callable[..., Any]
) -> None:
    text = DOC.read_text()
    files = re.findall(r"```toml\n# file: (\S+)\n(.*?)```", text, re.S)
    assert [f for f, _ in files] == [
        "data_manifests/state_cellload.toml",
        "data_manifests/experiment.toml",
    ]
    for name, body in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    (snippet,) = re.findall(r"```python\n(.*?)```", text, re.S)
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, str(DOC), "exec"), {})  # noqa: S102 - the doc's own snippet
    assert printed.getvalue().startswith("{'train': ")
    index, shards = read_all(tmp_path / "shards" / "state-cellload")
    ct = index.vocabularies["cell_type"]
    pert = index.vocabularies["perturbation"]
    for (
        entry,
        cols,
    ) in shards:  # the doc's rules: jurkat perturbed -> test, its controls -> train; hepg2 val list
        keep = cols[fmt.PRIMARY]
        cells = {
            (ct[c], pert[p])
            for c, p in zip(
                cols["obs/cell_type"][keep], cols["obs/perturbation"][keep], strict=True
            )
        }
        if entry.split == "test":
            assert all(p != "non-targeting" for _, p in cells)
            assert {c for c, _ in cells} <= {"jurkat", "hepg2"}
        if entry.split == "val":
            assert cells <= {("hepg2", "G00048"), ("hepg2", "G00271")}
        if entry.split == "train":
            assert all(p == "non-targeting" for c, p in cells if c == "jurkat")
