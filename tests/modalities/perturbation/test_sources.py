"""Every source flavour held to one contract; missing values, the legacy layout and the demo corpus
read back. Every bad input named precisely (file + row + problem):
tests/modalities/perturbation/test_sources_bad_input.py."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.errors import SourceError
from pipeline.modalities.perturbation import demo
from pipeline.modalities.perturbation.h5ad import H5adSource
from pipeline.modalities.perturbation.h5csr import H5CsrSource
from pipeline.modalities.perturbation.matrix import open_source
from pipeline.source import SOURCES, Source

SMALL = {"n_cells": 240, "n_genes": 40, "n_perts": 5, "seed": 7, "obsm_dim": 6}
H5AD_COLUMNS = ("perturbation", "cell_type", "batch", "timepoint")


@dataclass
class Case:
    kind: str
    path: Path
    matrix: str
    x: sp.csr_matrix  # expected matrix, exactly as stored
    var_names: tuple[str, ...]
    obs: dict[str, list[str]]  # column in the file -> expected strings
    obsm: dict[str, np.ndarray]
    row_nnz: np.ndarray
    counts: bool = True


def _h5ad_case(path: Path, adata: ad.AnnData, matrix: str = "X", dense: bool = False) -> Case:
    where, _, key = matrix.partition("/")
    x = sp.csr_matrix(
        adata.X if where == "X" else adata.raw.X if where == "raw" else getattr(adata, where)[key]
    )
    embedding = where == "obsm"
    names = tuple(f"X_pca_{i}" for i in range(x.shape[1])) if embedding else tuple(adata.var_names)
    obs = {c: adata.obs[c].astype(str).tolist() for c in H5AD_COLUMNS}
    row_nnz = np.full(x.shape[0], x.shape[1]) if dense or embedding else np.diff(x.indptr)
    return Case(
        "h5ad",
        path,
        matrix,
        x,
        names,
        obs,
        {"X_pca": adata.obsm["X_pca"]},
        row_nnz,
        counts=not embedding,
    )


def _h5csr_case(root: Path, var_key: str = "_index") -> Case:
    path = demo.write_h5csr(
        root / "k562.h5", n_cells=260, n_genes=40, n_perts=5, seed=3, hvg_dim=8, var_key=var_key
    )
    adata = demo.make_perturb_adata(
        260, 40, 5, ("k562",), 3, 3, 0.1, 0.15, 1, control_label="non-targeting"
    )
    x = sp.csr_matrix(adata.X)
    obs = {
        "gene": adata.obs["perturbation"].astype(str).tolist(),
        "gem_group": adata.obs["batch"].tolist(),
    }
    return Case(
        "h5csr",
        path,
        "X",
        x,
        tuple(adata.var_names),
        obs,
        {"X_hvg": demo.hvg_embedding(x, 8)},
        np.diff(x.indptr),
    )


class SourceContract:
    """Subclass and implement `build` to hold a new source flavour to the same contract."""

    def build(self, root: Path) -> Case:
        raise NotImplementedError

    @pytest.fixture(scope="class")
    @classmethod
    def case(cls, tmp_path_factory: pytest.TempPathFactory) -> Case:
        return cls().build(tmp_path_factory.mktemp(cls.__name__))

    @pytest.fixture
    def source(self, case: Case) -> Iterator[Source]:
        src = open_source(case.kind, case.path, case.matrix, counts=case.counts)
        yield src
        src.close()

    def test_kind_is_registered(self, case: Case, source: Source) -> None:
        assert type(source) is SOURCES[case.kind] and source.type == case.kind

    def test_meta_shapes_var_names_row_nnz(self, case: Case, source: Source) -> None:
        meta = source.meta([])
        assert (meta.n_rows, meta.n_cols) == case.x.shape
        assert meta.var_names == case.var_names
        assert meta.row_nnz.dtype == np.int64 and np.array_equal(meta.row_nnz, case.row_nnz)
        assert meta.path == case.path

    def test_obs_decodes_to_original_strings(self, case: Case, source: Source) -> None:
        meta = source.meta(list(case.obs))
        assert set(meta.obs) == set(case.obs)
        for column, expected in case.obs.items():
            cat = meta.obs[column]
            assert cat.codes.dtype == np.int32 and isinstance(cat.categories, tuple)
            assert all(isinstance(c, str) for c in cat.categories)
            assert [cat.categories[c] for c in cat.codes] == expected

    def test_string_columns_get_sorted_categories(self, case: Case, source: Source) -> None:
        for column, cat in source.meta(list(case.obs)).obs.items():
            if column in ("batch", "timepoint", "gem_group"):
                assert list(cat.categories) == sorted(set(case.obs[column]))

    def test_read_rows_equals_original(self, case: Case, source: Source) -> None:
        n = case.x.shape[0]
        for start, stop in [(0, 1), (0, n), (5, 37), (n - 3, n), (17, 17), (101, 160)]:
            block = source.read_rows(start, stop)
            assert isinstance(block, sp.csr_matrix) and block.dtype == np.float32
            assert block.shape == (stop - start, case.x.shape[1])
            np.testing.assert_array_equal(block.toarray(), case.x[start:stop].toarray())

    def test_read_obsm_equals_original(self, case: Case, source: Source) -> None:
        meta = source.meta([])
        for key, expected in case.obsm.items():
            assert meta.obsm[key] == (expected.shape, "float32")
            block = source.read_obsm(key, 3, 50)
            assert block.dtype == np.float32
            np.testing.assert_array_equal(block, expected[3:50])

    def test_missing_obs_column_names_column_and_existing(self, case: Case, source: Source) -> None:
        with pytest.raises(SourceError) as err:
            source.meta(["no_such_column"])
        msg = str(err.value)
        assert str(case.path) in msg and "no_such_column" in msg
        assert all(c in msg for c in case.obs)
        assert "no_such_column" not in source.meta([], optional=["no_such_column"]).obs

    def test_missing_obsm_key(self, case: Case, source: Source) -> None:
        with pytest.raises(SourceError, match="obsm key 'nope' not found"):
            source.read_obsm("nope", 0, 1)

    def test_copy_drops_handle_and_reopens(self, case: Case, source: Source) -> None:
        source.read_rows(0, 4)  # handle now open
        clone = copy.deepcopy(source)  # same protocol (__getstate__) a process pool uses
        np.testing.assert_array_equal(clone.read_rows(2, 9).toarray(), case.x[2:9].toarray())
        clone.close()
        np.testing.assert_array_equal(source.read_rows(2, 9).toarray(), case.x[2:9].toarray())


class TestH5adCsr(SourceContract):
    def build(self, root: Path) -> Case:
        return _h5ad_case(
            demo.write_perturb_h5ad(root / "a.h5ad", **SMALL), demo.make_perturb_adata(**SMALL)
        )


class TestH5adDense(SourceContract):
    def build(self, root: Path) -> Case:
        path = demo.write_perturb_h5ad(root / "d.h5ad", **SMALL, dense=True)
        return _h5ad_case(path, demo.make_perturb_adata(**SMALL), dense=True)


class TestH5adLegacy(SourceContract):
    def build(self, root: Path) -> Case:
        path = demo.write_perturb_h5ad(root / "l.h5ad", **SMALL, legacy=True)
        return _h5ad_case(path, demo.make_perturb_adata(**SMALL))


class TestH5adLegacyDense(SourceContract):
    def build(self, root: Path) -> Case:
        path = demo.write_legacy_h5ad(root / "ld.h5ad", **SMALL, dense=True)
        return _h5ad_case(path, demo.make_perturb_adata(**SMALL), dense=True)


class TestH5adLegacyRawCompoundObsm(SourceContract):
    def build(self, root: Path) -> Case:
        path = demo.write_legacy_h5ad(
            root / "lr.h5ad", **SMALL, normalized=True, obsm_layout="compound"
        )
        return _h5ad_case(path, demo.make_perturb_adata(**SMALL, normalized=True), matrix="raw/X")


class TestH5adLayersCounts(SourceContract):
    def build(self, root: Path) -> Case:
        path = demo.write_perturb_h5ad(root / "n.h5ad", **SMALL, normalized=True)
        return _h5ad_case(
            path, demo.make_perturb_adata(**SMALL, normalized=True), matrix="layers/counts"
        )


class TestH5adRawX(SourceContract):
    def build(self, root: Path) -> Case:
        path = demo.write_perturb_h5ad(root / "r.h5ad", **SMALL, normalized=True)
        return _h5ad_case(path, demo.make_perturb_adata(**SMALL, normalized=True), matrix="raw/X")


class TestH5adObsmMatrix(SourceContract):
    def build(self, root: Path) -> Case:
        path = demo.write_perturb_h5ad(root / "o.h5ad", **SMALL)
        return _h5ad_case(path, demo.make_perturb_adata(**SMALL), matrix="obsm/X_pca")


class TestH5csr(SourceContract):
    def build(self, root: Path) -> Case:
        return _h5csr_case(root)


class TestH5csrGeneNameVar(SourceContract):
    def build(self, root: Path) -> Case:
        return _h5csr_case(root, var_key="gene_name")


# --- missing values and the legacy layout -------------------------------------------------------


def test_missing_values_become_minus_one(tmp_path: Path) -> None:
    adata = demo.make_perturb_adata(**SMALL)
    adata.obs.loc[adata.obs_names[[4, 9]], "perturbation"] = np.nan
    adata.obs["dose"] = np.where(
        np.arange(adata.n_obs) % 5 == 0, np.nan, np.arange(adata.n_obs) % 3 * 0.5
    )
    adata.write_h5ad(tmp_path / "na.h5ad")
    obs = H5adSource(tmp_path / "na.h5ad").meta(["perturbation", "dose"]).obs
    assert obs["perturbation"].codes[4] == obs["perturbation"].codes[9] == -1
    assert (obs["perturbation"].codes >= 0).sum() == adata.n_obs - 2
    assert obs["dose"].categories == ("0.0", "0.5", "1.0")  # numeric columns sort numerically
    assert np.array_equal(obs["dose"].codes == -1, np.arange(adata.n_obs) % 5 == 0)


def test_legacy_missing_category_code(tmp_path: Path) -> None:
    path = demo.write_legacy_h5ad(tmp_path / "l.h5ad", **SMALL)
    with h5py.File(path, "r+") as f:
        table = f["obs"][()]
        table["perturbation"][7] = -1
        f["obs"][...] = table
    assert H5adSource(path).meta(["perturbation"]).obs["perturbation"].codes[7] == -1


def test_legacy_file_reads_back_with_anndata(tmp_path: Path) -> None:
    path = demo.write_legacy_h5ad(
        tmp_path / "l.h5ad", **SMALL, normalized=True, obsm_layout="compound"
    )
    expected = demo.make_perturb_adata(**SMALL, normalized=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # OldFormatWarning: the point of the file
        back = ad.read_h5ad(path)
    assert back.obs.index.tolist() == expected.obs.index.tolist()
    for column in H5AD_COLUMNS:
        assert back.obs[column].astype(str).tolist() == expected.obs[column].astype(str).tolist()
    assert str(back.obs["perturbation"].dtype) == "category"  # uns/<col>_categories reattached
    assert (back.X != expected.X).nnz == 0 and (back.raw.X != expected.raw.X).nnz == 0
    assert (back.layers["counts"] != expected.layers["counts"]).nnz == 0
    np.testing.assert_array_equal(back.obsm["X_pca"], expected.obsm["X_pca"])


def test_write_demo_corpus(tmp_path: Path) -> None:
    paths = demo.write_perturbation_demo(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [
        "perturb/screen_a.h5ad",
        "perturb/screen_b.h5ad",
        "perturb/screen_c.h5ad",
        "state/hepg2.h5",
        "state/jurkat.h5",
    ]
    genes = None
    for path in paths:
        src = (
            H5adSource(path, counts=True)
            if path.suffix == ".h5ad"
            else H5CsrSource(path, counts=True)
        )
        columns = ["perturbation", "cell_type"] if path.suffix == ".h5ad" else ["gene", "gem_group"]
        meta = src.meta(columns, optional=["cell_type"])
        assert 1500 <= meta.n_rows <= 2500 and meta.n_cols == 600
        genes = genes or meta.var_names
        assert meta.var_names == genes
        assert src.read_rows(meta.n_rows - 100, meta.n_rows).shape == (100, 600)
        src.close()
