"""Errors that name the fix instead of misleading: a wrong source type reads as a wrong type (not
"the file's obs columns: none"), a wrong-case control label is named among the labels the error
lists, `verify` on a path that holds no dataset is bad input (exit 2, not 1: the code for a
damaged dataset), and a numeric obs column listed as a one-hot covariate is refused, pointing to
``numeric_covariates`` (it made one condition per value)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anndata as ad
import numpy as np
import pytest

from pipeline.cli import main
from pipeline.errors import EXIT_BAD_INPUT, EXIT_OK
from pipeline.modalities.perturbation.cells import no_controls
from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from tests import hostile

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


@pytest.mark.process
@hostile.parametrize
def test_a_wrong_source_type_is_named_as_such(case: hostile.Case, tmp_path: Path) -> None:
    res = _build(tmp_path, 'type = "h5csr"', '"control"', legacy=True)
    assert res.returncode == 2, res.stderr
    assert "set [[sources]] type = 'h5ad'" in res.stderr, res.stderr


@pytest.mark.process
@hostile.parametrize
def test_a_wrong_case_control_label_is_named(case: hostile.Case, tmp_path: Path) -> None:
    res = _build(tmp_path, "", '"Control"')
    assert res.returncode == 2, res.stderr
    assert "did you mean 'control'" in res.stderr, res.stderr


def test_the_near_label_comes_first_even_among_many() -> None:
    used = [f"GENE{i}" for i in range(40)] + ["Dendritic"]
    msg = no_controls({"dendritic"}, used, "cell_label")
    assert "labels include: Dendritic" in msg and "did you mean 'Dendritic'" in msg


@hostile.parametrize
def test_verify_on_no_dataset_is_bad_input(
    case: hostile.Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nothing"
    if case.data == "file":
        path.write_text("not a dataset")
    elif case.data == "empty":
        path.mkdir()
    assert main(["verify", str(path)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert str(path) in err and "pass a dataset folder" in err, err


COVARIATE = """[dataset]
name = "c"
[[sources]]
path = "a.h5ad"
[fields]
perturbation = "perturbation"
control = ["control"]
cell_type = "cell_type"
batch = "batch"
covariates = ["{column}"]
"""


@hostile.parametrize
def test_a_numeric_covariate_is_refused(
    case: hostile.Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A numbers column as a one-hot covariate: refused when a value has a fraction or it has more
    than 16 distinct whole numbers; a few whole numbers (a replicate) still build as labels."""
    column, values, message = case.data
    write_perturb_h5ad(tmp_path / "a.h5ad", n_cells=300, n_genes=30, n_perts=4, seed=2)
    adata = ad.read_h5ad(tmp_path / "a.h5ad")
    rng = np.random.default_rng(0)
    adata.obs[column] = {
        "many-ints": rng.integers(100, 900, adata.n_obs),  # like n_genes
        "fractions": rng.choice([0.1, 0.5, 2.5], adata.n_obs),  # like a dose
    }[values]
    adata.obs["replicate"] = rng.integers(1, 4, adata.n_obs)
    adata.write_h5ad(tmp_path / "a.h5ad")
    (tmp_path / "m.toml").write_text(COVARIATE.format(column=column))
    rc = main(["build", str(tmp_path / "m.toml"), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT, err
    assert "[fields.covariates]" in err and repr(column) in err, err
    assert message in err and "numeric_covariates" in err, err
    (tmp_path / "ok.toml").write_text(COVARIATE.format(column="replicate"))
    rc = main(["build", str(tmp_path / "ok.toml"), "--out", str(tmp_path / "ok"), "--no-progress"])
    assert rc == EXIT_OK, capsys.readouterr().err
