"""Every source flavour held to one contract, and every bad input named precisely (file + row + problem)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from pipeline import demo
from pipeline.errors import SourceError
from pipeline.sources import (
    SOURCES,
    CsrParts,
    H5adSource,
    H5CsrSource,
    Source,
    open_source,
    validate_block,
    validate_dense,
)

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
    extra: dict[str, object] = field(default_factory=dict)


def _h5ad_case(path: Path, adata: ad.AnnData, matrix: str = "X", dense: bool = False) -> Case:
    if matrix == "X":
        x = sp.csr_matrix(adata.X)
    elif matrix == "raw/X":
        x = sp.csr_matrix(adata.raw.X)
    elif matrix.startswith("layers/"):
        x = sp.csr_matrix(adata.layers[matrix.split("/", 1)[1]])
    else:
        x = sp.csr_matrix(adata.obsm[matrix.split("/", 1)[1]])
    stored_dense = dense or matrix.startswith("obsm/")
    return Case(
        kind="h5ad",
        path=path,
        matrix=matrix,
        x=x,
        var_names=tuple(f"X_pca_{i}" for i in range(x.shape[1]))
        if matrix.startswith("obsm/")
        else tuple(adata.var_names),
        obs={c: adata.obs[c].astype(str).tolist() for c in H5AD_COLUMNS},
        obsm={"X_pca": adata.obsm["X_pca"]},
        row_nnz=np.full(x.shape[0], x.shape[1]) if stored_dense else np.diff(x.indptr),
        counts=not matrix.startswith("obsm/"),
    )


def _h5csr_case(root: Path, var_key: str = "_index") -> Case:
    path = demo.write_h5csr(root / "k562.h5", n_cells=260, n_genes=40, n_perts=5, seed=3, hvg_dim=8, var_key=var_key)
    adata = demo.make_perturb_adata(260, 40, 5, ("k562",), 3, 3, 0.1, 0.15, 1, control_label="non-targeting")
    x = sp.csr_matrix(adata.X)
    return Case(
        kind="h5csr",
        path=path,
        matrix="X",
        x=x,
        var_names=tuple(adata.var_names),
        obs={"gene": adata.obs["perturbation"].astype(str).tolist(), "gem_group": adata.obs["batch"].tolist()},
        obsm={"X_hvg": demo.hvg_embedding(x, 8)},
        row_nnz=np.diff(x.indptr),
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
        assert type(source) is SOURCES[case.kind] and source.kind == case.kind

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
        return _h5ad_case(demo.write_perturb_h5ad(root / "a.h5ad", **SMALL), demo.make_perturb_adata(**SMALL))


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
        path = demo.write_legacy_h5ad(root / "lr.h5ad", **SMALL, normalized=True, obsm_layout="compound")
        return _h5ad_case(path, demo.make_perturb_adata(**SMALL, normalized=True), matrix="raw/X")


class TestH5adLayersCounts(SourceContract):
    def build(self, root: Path) -> Case:
        path = demo.write_perturb_h5ad(root / "n.h5ad", **SMALL, normalized=True)
        return _h5ad_case(path, demo.make_perturb_adata(**SMALL, normalized=True), matrix="layers/counts")


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


# --- file-level failures ------------------------------------------------------------------------


def _raises(fn: Callable[[], object], path: Path, *needles: str) -> str:
    with pytest.raises(SourceError) as err:
        fn()
    msg = str(err.value)
    assert err.value.path == str(path) and str(path) in msg
    for needle in needles:
        assert needle in msg, msg
    return msg


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_missing_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "absent.h5"
    _raises(lambda: open_source(kind, path).meta([]), path, "file not found")


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_not_hdf5(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "notes.h5ad"
    path.write_text("cell,gene,count\n" * 100)
    _raises(lambda: open_source(kind, path).read_rows(0, 1), path, "not an HDF5 file")


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_truncated_hdf5(tmp_path: Path, kind: str) -> None:
    path = demo.write_perturb_h5ad(tmp_path / "cut.h5ad", **SMALL)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _raises(lambda: open_source(kind, path).meta([]), path, "truncated")


def test_unknown_kind_and_matrix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="h5ad, h5csr"):
        open_source("zarr", tmp_path / "x")
    path = demo.write_perturb_h5ad(tmp_path / "m.h5ad", **SMALL)
    _raises(lambda: open_source("h5ad", path, "layers/spliced").meta([]), path, "'layers/spliced' not found", "X")


# --- corrupted matrices -------------------------------------------------------------------------


def _csr_file(tmp_path: Path, kind: str) -> tuple[Path, sp.csr_matrix, str]:
    """A small CSR file of `kind` plus the HDF5 group its matrix lives in."""
    if kind == "h5csr":
        path = demo.write_h5csr(tmp_path / "c.h5", n_cells=240, n_genes=40, n_perts=5, seed=7, hvg_dim=4)
        x = sp.csr_matrix(
            demo.make_perturb_adata(240, 40, 5, ("c",), 3, 7, 0.1, 0.15, 1, control_label="non-targeting").X
        )
        return path, x, "X"
    path = demo.write_perturb_h5ad(tmp_path / "c.h5ad", **SMALL, legacy=kind == "legacy")
    return path, sp.csr_matrix(demo.make_perturb_adata(**SMALL).X), "X"


def _kind(flavour: str) -> str:
    return "h5ad" if flavour == "legacy" else flavour


FLAVOURS = ["h5ad", "legacy", "h5csr"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_non_monotonic_indptr(tmp_path: Path, flavour: str) -> None:
    path, x, group = _csr_file(tmp_path, flavour)
    with h5py.File(path, "r+") as f:
        f[f"{group}/indptr"][40] = x.indptr[39] - 1
    src = open_source(_kind(flavour), path)
    _raises(lambda: src.meta([]), path, "row 39", "non-monotonic indptr")
    _raises(lambda: src.read_rows(30, 50), path, "row 39", "non-monotonic indptr")
    assert src.read_rows(0, 39).shape == (39, x.shape[1])  # blocks before the damage still read


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_indptr_longer_than_data(tmp_path: Path, flavour: str) -> None:
    path, x, group = _csr_file(tmp_path, flavour)
    keep = int(x.indptr[200])  # rows 200.. now point past the stored entries
    with h5py.File(path, "r+") as f:
        for name in ("data", "indices"):
            values = f[f"{group}/{name}"][:keep]
            del f[f"{group}/{name}"]
            f[f"{group}/{name}"] = values
    src = open_source(_kind(flavour), path)
    first_bad = int(np.argmax(x.indptr[1:] > keep))
    _raises(lambda: src.meta([]), path, f"row {first_bad}", "indptr does not match data length")
    _raises(lambda: src.read_rows(190, 240), path, f"row {first_bad}", "indptr does not match data length")
    assert src.read_rows(0, 150).nnz == x[:150].nnz


def _poke(path: Path, dataset: str, at: int, value: float) -> None:
    with h5py.File(path, "r+") as f:
        f[dataset][at] = value


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_column_index_out_of_range(tmp_path: Path, flavour: str) -> None:
    path, x, group = _csr_file(tmp_path, flavour)
    row = int(np.flatnonzero(np.diff(x.indptr) > 1)[60])
    _poke(path, f"{group}/indices", int(x.indptr[row]) + 1, x.shape[1])
    src = open_source(_kind(flavour), path)
    _raises(lambda: src.read_rows(row - 5, row + 5), path, f"row {row}", f"column index {x.shape[1]} out of range")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_nan_value(tmp_path: Path, flavour: str) -> None:
    path, x, group = _csr_file(tmp_path, flavour)
    row = int(np.flatnonzero(np.diff(x.indptr))[77])
    _poke(path, f"{group}/data", int(x.indptr[row]), np.nan)
    src = open_source(_kind(flavour), path, counts=False)
    _raises(lambda: src.read_rows(row - 1, row + 1), path, f"row {row}", "NaN")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_negative_value_only_rejected_for_counts(tmp_path: Path, flavour: str) -> None:
    path, x, group = _csr_file(tmp_path, flavour)
    row = int(np.flatnonzero(np.diff(x.indptr))[12])
    _poke(path, f"{group}/data", int(x.indptr[row]), -3.0)
    counts = open_source(_kind(flavour), path, counts=True)
    _raises(lambda: counts.read_rows(0, 100), path, f"row {row}", "negative value (-3.0)", "counts")
    block = open_source(_kind(flavour), path, counts=False).read_rows(0, 100)
    assert block[row].toarray().min() == -3.0


def test_dense_matrix_errors(tmp_path: Path) -> None:
    path = demo.write_perturb_h5ad(tmp_path / "d.h5ad", **SMALL, dense=True)
    with h5py.File(path, "r+") as f:
        f["X"][50, 3] = np.inf
        f["X"][90, 7] = -1.0
    src = open_source("h5ad", path, counts=True)
    _raises(lambda: src.read_rows(40, 60), path, "row 50", "NaN or inf", "column 3")
    _raises(lambda: src.read_rows(80, 100), path, "row 90", "negative value", "column 7")
    assert open_source("h5ad", path, counts=False).read_rows(80, 100).shape == (20, SMALL["n_genes"])


def test_out_of_range_obs_codes(tmp_path: Path) -> None:
    path, _, _ = _csr_file(tmp_path, "h5csr")
    _poke(path, "obs/gene/codes", 11, 99)
    _raises(lambda: open_source("h5csr", path).meta(["gene"]), path, "'gene'", "row 11", "code 99")


# --- missing values and the legacy layout -------------------------------------------------------


def test_missing_values_become_minus_one(tmp_path: Path) -> None:
    adata = demo.make_perturb_adata(**SMALL)
    adata.obs.loc[adata.obs_names[[4, 9]], "perturbation"] = np.nan
    adata.obs["dose"] = np.where(np.arange(adata.n_obs) % 5 == 0, np.nan, np.arange(adata.n_obs) % 3 * 0.5)
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
    path = demo.write_legacy_h5ad(tmp_path / "l.h5ad", **SMALL, normalized=True, obsm_layout="compound")
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
    paths = demo.write_demo(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == [
        "perturb/screen_a.h5ad",
        "perturb/screen_b.h5ad",
        "perturb/screen_c.h5ad",
        "state/hepg2.h5",
        "state/jurkat.h5",
    ]
    genes = None
    for path in paths:
        src = H5adSource(path, counts=True) if path.suffix == ".h5ad" else H5CsrSource(path, counts=True)
        columns = ["perturbation", "cell_type"] if path.suffix == ".h5ad" else ["gene", "gem_group"]
        meta = src.meta(columns, optional=["cell_type"])
        assert 1500 <= meta.n_rows <= 2500 and meta.n_cols == 600
        genes = genes or meta.var_names
        assert meta.var_names == genes
        assert src.read_rows(meta.n_rows - 100, meta.n_rows).shape == (100, 600)
        src.close()


# --- validate_* on raw parts --------------------------------------------------------------------


def test_validate_block_accepts_parts_and_matrices() -> None:
    x = sp.random(30, 12, density=0.3, format="csr", dtype=np.float32, random_state=0)
    validate_block(x, "m.h5", 0, counts=True)
    validate_block((x.data, x.indices, x.indptr, 12), "m.h5", 0, counts=True)
    bad = CsrParts(x.data.copy(), x.indices.copy(), x.indptr.copy(), 12)
    bad.indices[int(x.indptr[20])] = -1
    with pytest.raises(SourceError, match=r"^m\.h5: row 1020: column index -1 out of range \[0, 12\)"):
        validate_block(bad, "m.h5", 1000, counts=False)
    with pytest.raises(SourceError, match="indices length"):
        validate_block((x.data, x.indices[:-1], x.indptr, 12), "m.h5", 0, counts=False)


def test_validate_dense() -> None:
    block = np.zeros((6, 4), dtype=np.float32)
    validate_dense(block, "d.h5", 0, counts=True, n_cols=4)
    with pytest.raises(SourceError, match="expected 5"):
        validate_dense(block, "d.h5", 0, counts=False, n_cols=5)
    block[4, 2] = np.nan
    with pytest.raises(SourceError, match="row 14: NaN or inf"):
        validate_dense(block, "d.h5", 10, counts=False)
