"""h5ad metadata read with h5py alone (pipeline.modalities.perturbation.h5ad.is_plain): the same
codes and categories as anndata's reader for the encodings it takes, and no anndata import for a
build's scan."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from pipeline.modalities.perturbation import demo
from pipeline.modalities.perturbation.h5ad import H5adSource

SMALL = {
    "n_cells": 240,
    "n_genes": 40,
    "n_perts": 5,
    "seed": 7,
    "obsm_dim": 6,
}  # as tests/modalities/perturbation/test_sources.py


def test_plain_encodings_read_like_anndata(tmp_path: Path) -> None:
    """The h5py-only reader of anndata's common encodings gives the codes and categories anndata's
    own reader gives, column by column; encodings it does not know still go through anndata."""
    import pandas as pd

    from pipeline.modalities.perturbation.h5ad import is_plain, read_elem
    from pipeline.modalities.perturbation.h5columns import to_categorical

    adata = demo.make_perturb_adata(**SMALL)
    n = adata.n_obs
    adata.obs.loc[adata.obs_names[[3, 8]], "perturbation"] = (
        np.nan
    )  # categorical with missing values
    adata.obs["dose"] = np.where(np.arange(n) % 5 == 0, np.nan, np.arange(n) % 3 * 0.5)
    adata.obs["plate"] = (np.arange(n) % 4).astype(np.int64)
    adata.obs["flag"] = np.arange(n) % 2 == 0
    adata.obs["well"] = [
        f"w{i % 7}" for i in range(n)
    ]  # strings: anndata writes them as categorical
    adata.obs["int_cats"] = pd.Categorical(np.arange(n) % 3 + 10)
    adata.obs["nullable_int"] = pd.array(
        np.where(np.arange(n) % 6 == 0, None, np.arange(n) % 2), dtype="Int64"
    )
    path = tmp_path / "encodings.h5ad"
    adata.write_h5ad(path)
    columns = [c for c in adata.obs.columns]
    with h5py.File(path, "r") as f:
        expected = {c: to_categorical(read_elem(f["obs"][c])) for c in columns}
        plain = {c: is_plain(f["obs"][c]) for c in columns}
    assert not plain["nullable_int"] and all(v for c, v in plain.items() if c != "nullable_int")
    got = H5adSource(path).meta(columns)
    for c in columns:
        assert got.obs[c].categories == expected[c].categories, c
        np.testing.assert_array_equal(got.obs[c].codes, expected[c].codes, err_msg=c)
    assert got.var_names == tuple(adata.var_names)


@pytest.mark.process
def test_reading_an_h5ad_scan_does_not_import_anndata(tmp_path: Path) -> None:
    """anndata (with pandas' extras and dask.array) costs ~0.6 s to import: an incremental rebuild
    that rescans one changed source should not pay it for the encodings anndata writes by
    default."""
    import json
    import subprocess
    import sys

    path = tmp_path / "s.h5ad"
    demo.make_perturb_adata(**SMALL).write_h5ad(path)
    code = (
        "import sys, json; from pipeline.modalities.perturbation.h5ad import H5adSource; "
        f"m = H5adSource({str(path)!r}).meta(['perturbation', 'cell_type', 'batch', 'timepoint']); "
        "print(json.dumps([len(m.var_names), 'anndata' in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [SMALL["n_genes"], False]
