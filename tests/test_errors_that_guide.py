"""Errors that name the fix instead of misleading: a wrong source type reads as a wrong type (not
"the
file's obs columns: none"), and a wrong-case control label is named among the labels the error
lists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.modalities.perturbation.cells import no_controls
from pipeline.modalities.perturbation.demo import write_perturb_h5ad

MANIFEST = """[dataset]
name = "e"
[[sources]]
path = "a.h5ad"
{type}
[fields]
perturbation = "perturbation"
control = [{control}]
cell_type = "cell_type"
batch = "batch"
"""


def _build(
    tmp_path: Path, type_line: str, control: str, legacy: bool = False
) -> subprocess.CompletedProcess[str]:
    write_perturb_h5ad(
        tmp_path / "a.h5ad", n_cells=300, n_genes=40, n_perts=4, seed=1, legacy=legacy
    )
    (tmp_path / "m.toml").write_text(MANIFEST.format(type=type_line, control=control))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            str(tmp_path / "m.toml"),
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )


def test_a_wrong_source_type_is_named_as_such(tmp_path: Path) -> None:
    res = _build(tmp_path, 'type = "h5csr"', '"control"', legacy=True)
    assert res.returncode == 2, res.stderr
    assert "set [[sources]] type = 'h5ad'" in res.stderr, res.stderr


def test_a_wrong_case_control_label_is_named(tmp_path: Path) -> None:
    res = _build(tmp_path, "", '"Control"')
    assert res.returncode == 2, res.stderr
    assert "did you mean 'control'" in res.stderr, res.stderr


def test_the_near_label_comes_first_even_among_many() -> None:
    used = [f"GENE{i}" for i in range(40)] + ["Dendritic"]
    msg = no_controls({"dendritic"}, used, "cell_label")
    assert "labels include: Dendritic" in msg and "did you mean 'Dendritic'" in msg
