"""Every bad source file named precisely (file + row + problem): unreadable files (missing, not
HDF5, truncated), an unknown kind or matrix, corrupted matrices (indptr, column indices, NaN,
negative counts, dense values) and obs codes, per flavour; the scan checks barcodes without reading
them; an h5 file outside anndata's layout reads (plain columns, no shape, fallback names) and its
CSC matrix is refused. The contract every source flavour is held to: tests/modalities/perturbation/test_sources.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.errors import SourceError
from pipeline.modalities.perturbation import demo
from pipeline.modalities.perturbation.h5csr import H5CsrSource
from pipeline.modalities.perturbation.matrix import MatrixSource, open_source
from pipeline.source import SOURCES

# the small demo file of tests/modalities/perturbation/test_sources.py
SMALL = {"n_cells": 240, "n_genes": 40, "n_perts": 5, "seed": 7, "obsm_dim": 6}


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


# --- the scan's barcode check, and an h5 file outside anndata's layout ----------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_scan_checks_barcodes_without_reading_them(tmp_path: Path, flavour: str) -> None:
    """meta(names=False) (the scan) keeps no barcodes but says the source has them, and refuses an
    obs index of the wrong length as meta() does; the names the plan reads later are meta()'s."""
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
