"""Inputs that used to build (exit 0) into datasets nobody can use are refused at build, naming the
key or the file: spike ``frames = "all"`` with a ``num_bins`` that does not divide the stored
frames (the same mistake as ``frames = 40`` with ``num_bins = 7``, which was already refused),
and a 0-gene matrix.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.modalities.spike.demo import write_spike_demo
from tests import hostile

pytestmark = pytest.mark.process  # the CLI in a subprocess

SPIKE = """[dataset]
name = "s"
kind = "spike"
[[sources]]
path = "data/spike"
type = "dat"
[spike]
height = 64
width = 96
frames = "all"
num_bins = {bins}
layout = "gopro"
"""

CELLS = """[dataset]
name = "z"
[[sources]]
path = "zero.h5ad"
[fields]
perturbation = "perturbation"
control = ["control"]
cell_type = "cell_type"
batch = "batch"
"""


def _build(manifest: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            str(manifest),
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )


@hostile.parametrize
def test_spike_all_frames_with_bins_that_do_not_divide_them_is_refused(
    case: hostile.Case, tmp_path: Path
) -> None:
    write_spike_demo(tmp_path / "data")
    frames = {p.stat().st_size for p in (tmp_path / "data" / "spike").rglob("*.dat")}
    per_frame = 64 * 96 // 8
    total = {s // per_frame for s in frames}
    bins = next(b for b in range(2, 50) if all(t % b for t in total))
    (tmp_path / "m.toml").write_text(SPIKE.format(bins=bins))
    res = _build(tmp_path / "m.toml", tmp_path / "out")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "spike.num_bins" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out" / "index.json").exists()
    ok = next(b for b in range(1, 50) if all(t % b == 0 for t in total))
    (tmp_path / "ok.toml").write_text(SPIKE.format(bins=ok))
    assert _build(tmp_path / "ok.toml", tmp_path / "ok").returncode == 0


@hostile.parametrize
def test_a_matrix_without_genes_is_refused(case: hostile.Case, tmp_path: Path) -> None:
    n = 20
    obs = {
        "perturbation": ["control", "g1"] * (n // 2),
        "cell_type": ["K562"] * n,
        "batch": ["b0"] * n,
    }
    import pandas as pd

    adata = ad.AnnData(
        X=sp.csr_matrix((n, 0), dtype=np.float32),
        obs=pd.DataFrame(obs, index=[f"c{i}" for i in range(n)]),
    )
    adata.write_h5ad(tmp_path / "zero.h5ad")
    (tmp_path / "m.toml").write_text(CELLS)
    res = _build(tmp_path / "m.toml", tmp_path / "out")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "zero.h5ad" in res.stderr and "no genes" in res.stderr
