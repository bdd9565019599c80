"""Interop: gene names, splits, condition table, cell barcodes per record, `shardsmith export` to
AnnData."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anndata as ad
import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from loaders import ShardDataset
from loaders import format as fmt
from pipeline.cli import main
from pipeline.modalities.perturbation.demo import (
    make_perturb_adata,
    write_h5csr,
    write_perturb_h5ad,
)


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, write_manifest: Callable[..., Any]
) -> tuple[Path, ad.AnnData]:
    """Two modern h5ad files with their own barcodes and one pre-0.7 file (index in the compound obs
    table)."""
    tmp = tmp_path_factory.mktemp("interop")
    (tmp / "src").mkdir()
    for i in range(2):
        a = make_perturb_adata(n_cells=150, n_genes=30, n_perts=5, seed=i)
        a.obs_names = [f"f{i}-{'ACGT'[j % 4]}{j:05d}-1" for j in range(a.n_obs)]
        a.write_h5ad(tmp / "src" / f"s{i}.h5ad", convert_strings_to_categoricals=False)
    write_perturb_h5ad(
        tmp / "src" / "s2.h5ad", n_cells=120, n_genes=30, n_perts=5, seed=2, legacy=True
    )
    assert (
        main(
            [
                "build",
                str(write_manifest(tmp / "m.toml")),
                "--out",
                str(tmp / "out"),
                "--jobs",
                "1",
                "-q",
            ]
        )
        == 0
    )
    sources = [ad.read_h5ad(tmp / "src" / f"s{i}.h5ad") for i in range(3)]
    for s in sources:
        s.X = sp.csr_matrix(s.X, dtype=np.float32)
    return tmp / "out", ad.concat(sources, merge="same")  # row k = sample_id k


def test_dataset_knows_its_genes_splits_and_conditions(built: tuple[Path, ad.AnnData]) -> None:
    out, source = built
    ds = ShardDataset(
        out, split="val", sample="cells", batch_size=64, shuffle=False, decode_process=False
    )
    assert ds.var_names == list(source.var_names)
    assert ds.splits == ["train", "val", "test"]
    batch = next(iter(ds))
    assert ds.vectors is not None and ds.vectors.shape == (
        fmt.read_index(out).conditions.rows,
        ds.condition_dim,
    )
    assert batch["cond"].shape[1] == ds.condition_dim > 0
    assert np.array_equal(batch["cond"].numpy(), ds.vectors[batch["cond_id"].numpy()])


def test_obs_names_map_back_from_sample_id(built: tuple[Path, ad.AnnData]) -> None:
    out, source = built
    for split in ("train", "test"):
        ds = ShardDataset(
            out, split=split, sample="pairs", batch_size=32, shuffle=True, decode_process=False
        )
        for batch in ds:
            for key in (
                "ctrl_id",
                "pert_id",
            ):  # pairs: the sample ids of the control and the perturbed cell
                ids = batch[key]
                assert list(ds.obs_names_for(ids)) == list(source.obs_names[ids.numpy()])
    assert (
        source.obs_names[0] == "f0-A00000-1" and source.obs_names[-1] == "cell0000119"
    )  # legacy index read
    with pytest.raises(KeyError, match="sample_id 999999"):
        ds.obs_names_for([999999])


def test_h5csr_sources_keep_their_barcodes(tmp_path: Path) -> None:
    from pipeline.modalities.perturbation.matrix import open_source

    path = write_h5csr(tmp_path / "K562.h5", n_cells=50, n_genes=20, n_perts=3)
    with open_source("h5csr", path, "X") as src:
        names = src.meta(["gene"]).obs_names
    with h5py.File(path) as f:
        expected = [v.decode() for v in f["obs/_index"][()]]
    got = [
        bytes(names.data[a:b]).decode()
        for a, b in zip(names.offsets[:-1], names.offsets[1:], strict=True)
    ]
    assert got == expected


@pytest.mark.parametrize("sample", ["cells", "pairs"])
def test_export_equals_the_source_rows(
    built: tuple[Path, ad.AnnData], tmp_path: Path, sample: str
) -> None:
    out, source = built
    dest = tmp_path / "val.h5ad"
    assert main(["export", str(out), str(dest), "--split", "val", "--sample", sample]) == 0
    got = ad.read_h5ad(dest)
    ids = got.obs["sample_id"].to_numpy()
    assert ids.size and np.all(np.diff(ids) > 0)
    src = source[ids]
    assert list(got.obs_names) == list(src.obs_names)
    assert list(got.var_names) == list(source.var_names)
    assert (got.X != src.X).nnz == 0 and got.X.dtype == np.float32
    for col in ("perturbation", "cell_type", "batch", "timepoint"):
        assert list(got.obs[col].astype(str)) == list(src.obs[col].astype(str)), col
        assert list(got.obs[col].cat.categories) == fmt.read_index(out).vocabularies[col]
    assert np.allclose(got.obsm["X_pca"], src.obsm["X_pca"])
    vectors = ShardDataset(out, split="val", decode_process=False).vectors
    assert np.array_equal(got.obsm["cond"], vectors[got.obs["cond_id"].to_numpy()])
    index = fmt.read_index(out)
    if sample == "cells":
        assert got.n_obs == sum(e.units["cells"] for e in index.shards_of("val"))
    else:
        ds = ShardDataset(out, split="val", sample="pairs", batch_size=64, decode_process=False)
        used = {int(i) for b in ds for k in ("ctrl_id", "pert_id") for i in b[k]}
        assert set(ids.tolist()) == used and got.obs["primary"].dtype == bool


def test_a_shard_is_not_an_anndata_store(built: tuple[Path, ad.AnnData]) -> None:
    """docs/FORMAT.md says so: anndata.read_zarr passes every top-level array to AnnData(); use
    export."""
    out, _ = built
    index = fmt.read_index(out)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        ad.read_zarr(index.shard_path(index.shards[0]))


def test_obs_names_read_in_chunks_and_gathered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.modalities.perturbation import obs_names as on

    monkeypatch.setattr(on, "CHUNK", 7)  # chunk boundaries inside the 50 names
    names = [f"bc{i}-" * (i % 3 + 1) + "é" for i in range(50)]  # varied lengths, non-ASCII
    with h5py.File(tmp_path / "n.h5", "w") as f:
        f.create_dataset(
            "obs/_index", data=np.array(names, dtype=object), dtype=h5py.string_dtype()
        )
        got = on.read_obs_names(f["obs"], 50, tmp_path / "n.h5")
        with pytest.raises(Exception, match="matrix has 49 rows"):
            on.read_obs_names(f["obs"], 49, tmp_path / "n.h5")
    rows = np.array([49, 0, 7, 7, 13])
    off, val = got.take(rows)
    from loaders.interop import decode_names

    assert list(decode_names(off, val)) == [names[i] for i in rows]
    assert list(decode_names(got.offsets, got.data)) == names
