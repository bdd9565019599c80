"""Errors that say the fix: counts that are not counts, missing optional extras, obs columns not in
the file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anndata as ad
import pytest

from pipeline import extras
from pipeline.backends import BackendError
from pipeline.build import build
from pipeline.errors import SourceError
from pipeline.modalities.perturbation.demo import write_perturb_h5ad

FIX = r'values = "counts".*set values = "any".*"raw/X"'


def test_counts_on_log_normalised_data_is_an_error_naming_the_key(
    tmp_path: Path, write_manifest: Callable[..., Any]
) -> None:
    write_perturb_h5ad(
        tmp_path / "src" / "a.h5ad", n_cells=200, n_genes=30, n_perts=4, normalized=True
    )
    manifest = write_manifest(tmp_path / "m.toml", obsm="[]")
    with pytest.raises(SourceError, match=r"non-integer value .* in a counts matrix .*" + FIX):
        build(manifest, tmp_path / "out", jobs=1, progress=False)
    left = [p for p in (tmp_path / "out").rglob("*") if not p.name.endswith(".lock")]
    assert left == [], (
        "checked at scan time: a first build leaves no conditions table, shards/ or spill"
    )
    manifest.write_text(manifest.read_text().replace('values = "counts"', 'values = "any"'))
    build(manifest, tmp_path / "out", jobs=1, progress=False)  # the fix the message names works


def test_counts_on_scaled_data_names_the_key_and_the_fix(
    tmp_path: Path, write_manifest: Callable[..., Any]
) -> None:
    p = write_perturb_h5ad(
        tmp_path / "src" / "a.h5ad", n_cells=200, n_genes=30, n_perts=4, dense=True
    )
    a = ad.read_h5ad(p)
    a.X = a.X - a.X.mean(axis=0)  # sc.pp.scale-like: centred, negative entries
    a.write_h5ad(p)
    manifest = write_manifest(tmp_path / "m.toml", obsm="[]")
    with pytest.raises(SourceError, match=r"negative value .* in a counts matrix .*" + FIX):
        build(manifest, tmp_path / "out", jobs=1, progress=False)


def test_a_missing_backend_extra_names_the_install_command_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_manifest: Callable[..., Any]
) -> None:
    monkeypatch.setitem(
        extras.EXTRAS, "not_installed_xyz", ("dask", "dask[distributed]", "--backend dask")
    )
    monkeypatch.setitem(extras.BACKEND_MODULES, "dask", "not_installed_xyz")
    write_perturb_h5ad(tmp_path / "src" / "a.h5ad", n_cells=100, n_genes=20, n_perts=3)
    manifest = write_manifest(tmp_path / "m.toml", obsm="[]")
    with pytest.raises(BackendError, match=r'--backend dask needs .* pip install -e "\.\[dask\]"'):
        build(manifest, tmp_path / "out", jobs=1, backend="dask", progress=False)
    assert not (tmp_path / "out").exists()


def test_missing_obs_column_names_the_manifest_key(
    tmp_path: Path, write_manifest: Callable[..., Any]
) -> None:
    write_perturb_h5ad(tmp_path / "src" / "a.h5ad", n_cells=100, n_genes=20, n_perts=3)
    manifest = write_manifest(tmp_path / "m.toml", obsm="[]", batch="gemgroup")
    with pytest.raises(
        SourceError,
        match=r"'gemgroup' \(\[fields\] batch = 'gemgroup'\).*perturbation.*leave batch out",
    ):
        build(manifest, tmp_path / "out", jobs=1, progress=False)
