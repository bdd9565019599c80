"""Every source flavour held to one contract, and every bad input named precisely (file + row +
problem)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
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
from pipeline.modalities.perturbation.matrix import MatrixSource, open_source
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


# --- file-level failures ------------------------------------------------------------------------


def _raises(fn: Callable[[], object], path: Path, *needles: str) -> str:
    with pytest.raises(SourceError) as err:
        fn()
    msg = str(err.value)
    assert err.value.path == str(path) and str(path) in msg
    for needle in needles:
        assert needle in msg, msg
    return msg


UNREADABLE = [
    ("missing", "file not found"),
    ("text", "not an HDF5 file"),
    ("halved", "corrupt or truncated HDF5 file"),
]


@pytest.mark.parametrize(
    "kind", sorted(t for t, c in SOURCES.items() if issubclass(c, MatrixSource))
)
@pytest.mark.parametrize(("damage", "problem"), UNREADABLE)
def test_unreadable_file(tmp_path: Path, kind: str, damage: str, problem: str) -> None:
    path = demo.write_perturb_h5ad(tmp_path / "f.h5ad", **SMALL)
    if damage == "missing":
        path.unlink()
    elif damage == "text":
        path.write_text("cell,gene,count\n" * 100)
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    src = open_source(kind, path)
    _raises(lambda: src.meta([]), path, problem)
    _raises(lambda: src.read_rows(0, 1), path, problem)


def test_unknown_kind_and_matrix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="h5ad, h5csr"):
        open_source("zarr", tmp_path / "x")
    path = demo.write_perturb_h5ad(tmp_path / "m.h5ad", **SMALL)
    _raises(
        lambda: open_source("h5ad", path, "layers/spliced").meta([]),
        path,
        "'layers/spliced' not found",
        "X",
    )


# --- corrupted matrices -------------------------------------------------------------------------


def _csr_file(tmp_path: Path, flavour: str) -> tuple[Path, sp.csr_matrix, str]:
    """A small CSR file (matrix in group X) of a flavour, what it holds, and the source kind that
    reads it."""
    if flavour == "h5csr":
        path = demo.write_h5csr(
            tmp_path / "c.h5", n_cells=240, n_genes=40, n_perts=5, seed=7, hvg_dim=4
        )
        adata = demo.make_perturb_adata(
            240, 40, 5, ("c",), 3, 7, 0.1, 0.15, 1, control_label="non-targeting"
        )
        return path, sp.csr_matrix(adata.X), "h5csr"
    path = demo.write_perturb_h5ad(tmp_path / "c.h5ad", **SMALL, legacy=flavour == "legacy")
    return path, sp.csr_matrix(demo.make_perturb_adata(**SMALL).X), "h5ad"


FLAVOURS = ["h5ad", "legacy", "h5csr"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_non_monotonic_indptr(tmp_path: Path, flavour: str) -> None:
    path, x, kind = _csr_file(tmp_path, flavour)
    with h5py.File(path, "r+") as f:
        f["X/indptr"][40] = x.indptr[39] - 1
    src = open_source(kind, path)
    _raises(lambda: src.meta([]), path, "row 39", "non-monotonic indptr")
    _raises(lambda: src.read_rows(30, 50), path, "row 39", "non-monotonic indptr")
    assert src.read_rows(0, 39).shape == (39, x.shape[1])  # blocks before the damage still read


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_indptr_longer_than_data(tmp_path: Path, flavour: str) -> None:
    path, x, kind = _csr_file(tmp_path, flavour)
    keep = int(x.indptr[200])  # rows 200.. now point past the stored entries
    with h5py.File(path, "r+") as f:
        for name in ("data", "indices"):
            values = f[f"X/{name}"][:keep]
            del f[f"X/{name}"]
            f[f"X/{name}"] = values
    src = open_source(kind, path)
    first_bad = int(np.argmax(x.indptr[1:] > keep))
    _raises(lambda: src.meta([]), path, f"row {first_bad}", "indptr does not match data length")
    _raises(
        lambda: src.read_rows(190, 240),
        path,
        f"row {first_bad}",
        "indptr does not match data length",
    )
    assert src.read_rows(0, 150).nnz == x[:150].nnz


def _poke(path: Path, dataset: str, at: int, value: float) -> None:
    with h5py.File(path, "r+") as f:
        f[dataset][at] = value


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_column_index_out_of_range(tmp_path: Path, flavour: str) -> None:
    path, x, kind = _csr_file(tmp_path, flavour)
    row = int(np.flatnonzero(np.diff(x.indptr) > 1)[60])
    _poke(path, "X/indices", int(x.indptr[row]) + 1, x.shape[1])
    src = open_source(kind, path)
    _raises(
        lambda: src.read_rows(row - 5, row + 5),
        path,
        f"row {row}",
        f"column index {x.shape[1]} out of range",
    )


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_nan_value(tmp_path: Path, flavour: str) -> None:
    path, x, kind = _csr_file(tmp_path, flavour)
    row = int(np.flatnonzero(np.diff(x.indptr))[77])
    _poke(path, "X/data", int(x.indptr[row]), np.nan)
    src = open_source(kind, path, counts=False)
    _raises(lambda: src.read_rows(row - 1, row + 1), path, f"row {row}", "NaN")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_negative_value_only_rejected_for_counts(tmp_path: Path, flavour: str) -> None:
    path, x, kind = _csr_file(tmp_path, flavour)
    row = int(np.flatnonzero(np.diff(x.indptr))[12])
    _poke(path, "X/data", int(x.indptr[row]), -3.0)
    counts = open_source(kind, path, counts=True)
    _raises(lambda: counts.read_rows(0, 100), path, f"row {row}", "negative value (-3.0)", "counts")
    block = open_source(kind, path, counts=False).read_rows(0, 100)
    assert block[row].toarray().min() == -3.0


def test_dense_matrix_errors(tmp_path: Path) -> None:
    path = demo.write_perturb_h5ad(tmp_path / "d.h5ad", **SMALL, dense=True)
    with h5py.File(path, "r+") as f:
        f["X"][50, 3] = np.inf
        f["X"][90, 7] = -1.0
    src = open_source("h5ad", path, counts=True)
    _raises(lambda: src.read_rows(40, 60), path, "row 50", "NaN or inf", "column 3")
    _raises(lambda: src.read_rows(80, 100), path, "row 90", "negative value", "column 7")
    assert open_source("h5ad", path, counts=False).read_rows(80, 100).shape == (
        20,
        SMALL["n_genes"],
    )


def test_out_of_range_obs_codes(tmp_path: Path) -> None:
    path, _, _ = _csr_file(tmp_path, "h5csr")
    _poke(path, "obs/gene/codes", 11, 99)
    _raises(lambda: open_source("h5csr", path).meta(["gene"]), path, "'gene'", "row 11", "code 99")


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


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_scan_checks_barcodes_without_reading_them(tmp_path: Path, flavour: str) -> None:
    """meta(names=False) (the scan) keeps no barcodes but says the source has them, and refuses an
    obs index
    of the wrong length as meta() does; the names the plan reads later are meta()'s."""
    path, x, kind = _csr_file(tmp_path, flavour)
    src = open_source(kind, path)
    lean, full = src.meta([], names=False), src.meta([])
    assert lean.obs_names is None and lean.has_obs_names and full.obs_names is not None
    got = src.read_obs_names(x.shape[0])
    assert got is not None and np.array_equal(got.data, full.obs_names.data)
    src.close()
    if flavour == "legacy":  # a compound obs table: its index cannot be shorter than its rows
        return
    with h5py.File(path, "r+") as f:
        key = f["obs"].attrs.get("_index", "_index")
        key = key.decode() if isinstance(key, bytes) else str(key)
        names = f["obs"][key][:-1]
        del f["obs"][key]
        f["obs"].create_dataset(key, data=names, dtype=h5py.string_dtype())
    src = open_source(kind, path)
    for names_too in (False, True):
        _raises(
            lambda n=names_too: src.meta([], names=n), path, f"obs index has {x.shape[0] - 1} names"
        )


def test_h5csr_plain_columns_shapeless_csr_and_fallback_names(tmp_path: Path) -> None:
    x = sp.random(50, 6, density=0.4, format="csr", dtype=np.float32, random_state=1)
    labels = np.array([b"b", b"a", b"c"] * 16 + [b"a", b"a"])
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        for name in ("data", "indices", "indptr"):  # no shape attribute: columns come from var
            f[f"X/{name}"] = getattr(x, name)
        f["var/gene_symbols"] = np.array([f"g{i}" for i in range(6)], dtype="S")
        f["obs/guide"] = labels  # fixed-width bytes
        f["obs/line"] = np.array(["x", "y"] * 25, dtype=object).astype(h5py.string_dtype())
        f["obs/dose"] = np.where(np.arange(50) % 7 == 0, np.nan, np.arange(50) % 3 * 10.0)
        f["obs/__categories/phase"] = np.array(["G1", "S"], dtype=object).astype(
            h5py.string_dtype()
        )
        f["obs/phase"] = (
            np.arange(50, dtype=np.int8) % 2
        )  # anndata 0.7: codes referencing their categories
        f["obs/phase"].attrs["categories"] = f["obs/__categories/phase"].ref
        f["csc/X/data"], f["csc/X/indices"], f["csc/X/indptr"] = x.data, x.indices, x.indptr
        f["csc/X"].attrs["encoding-type"] = "csc_matrix"
    src = H5CsrSource(tmp_path / "plain.h5")
    meta = src.meta(["guide", "line", "dose", "phase"])
    assert (meta.n_rows, meta.n_cols) == (50, 6) and meta.var_names == tuple(
        f"g{i}" for i in range(6)
    )
    assert meta.obs["guide"].categories == ("a", "b", "c")
    assert [meta.obs["guide"].categories[c] for c in meta.obs["guide"].codes] == [
        v.decode() for v in labels
    ]
    assert meta.obs["line"].categories == ("x", "y")
    assert (
        meta.obs["dose"].categories == ("0.0", "10.0", "20.0") and meta.obs["dose"].codes[0] == -1
    )
    assert meta.obs["phase"].categories == ("G1", "S") and list(meta.obs["phase"].codes[:3]) == [
        0,
        1,
        0,
    ]
    np.testing.assert_array_equal(src.read_rows(10, 30).toarray(), x[10:30].toarray())
    with h5py.File(tmp_path / "dense.h5", "w") as f:
        f["X"] = x.toarray()  # no var, no obs: names fall back to gene_<i>
    dense = H5CsrSource(tmp_path / "dense.h5").meta([])
    assert (
        dense.var_names == tuple(f"gene_{i}" for i in range(6))
        and dense.row_nnz.tolist() == [6] * 50
    )
    path = tmp_path / "plain.h5"
    _raises(lambda: H5CsrSource(path, "csc/X").read_rows(0, 1), path, "CSC")
