"""`shardsmith export` of sources that share cell names (issue 25, item 16): two files of one screen
often number their cells alike, and an AnnData with repeated obs_names warns on every read and
breaks joins on them. Names are made unique by anndata's own rule (``-1``, ``-2``...), the
sources' names kept in ``obs["original_obs_name"]``."""

from __future__ import annotations

import warnings
from pathlib import Path

import anndata as ad
import pandas as pd

from pipeline.cli import main
from pipeline.errors import EXIT_OK
from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from tests import hostile

MANIFEST = """[dataset]
name = "e"
seed = 0
[[sources]]
path = "src/*.h5ad"
[fields]
perturbation = "perturbation"
control = ["control"]
cell_type = "cell_type"
batch = "batch"
[split]
val_fraction = 0.0
test_fraction = 0.0
"""


@hostile.parametrize
def test_shared_barcodes_are_made_unique_keeping_the_originals(
    case: hostile.Case, tmp_path: Path
) -> None:
    for seed in (1, 2):  # same cell count: both files name their cells cell0000000, ...
        write_perturb_h5ad(tmp_path / "src" / f"s{seed}.h5ad", n_cells=200, n_genes=30, seed=seed)
    (tmp_path / "m.toml").write_text(MANIFEST)
    out, h5ad = tmp_path / "out", tmp_path / "train.h5ad"
    assert main(["build", str(tmp_path / "m.toml"), "--out", str(out), "--no-progress"]) == EXIT_OK
    assert main(["export", str(out), str(h5ad), "--split", "train"]) == EXIT_OK
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # was: "obs_names are not unique" on every read
        adata = ad.read_h5ad(h5ad)
    original = pd.Index(adata.obs["original_obs_name"].astype(str))
    assert adata.obs_names.is_unique and not original.is_unique
    assert original.duplicated().sum() == 200
    assert list(adata.obs_names) == list(ad.utils.make_index_unique(original))
    assert {n for n in adata.obs_names if n.endswith("-1")} == {
        f"{n}-1" for n in original[original.duplicated()]
    }
