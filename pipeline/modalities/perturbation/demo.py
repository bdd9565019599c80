"""Synthetic perturbation screens, written on disk the way real producers write them.

Tests, docs and benchmarks need files that look like the ones the pipeline meets at night:
anndata's modern h5ad (scPerturb), the pre-0.7 h5ad layout of archived screens, and the
hand-rolled HDF5 of STATE / cell-load. Content is a function of the arguments (seeded), so a test
can rebuild the expected matrix in memory with `make_perturb_adata` instead of trusting a reader
to check itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp

from pipeline.modalities.perturbation.screen import (  # tests call these as demo.* too
    hvg_embedding,
    make_perturb_adata,
)

STR = h5py.string_dtype()  # variable-length UTF-8, what h5py and anndata write for text


def write_perturb_h5ad(
    path: str | Path,
    n_cells: int = 2000,
    n_genes: int = 500,
    n_perts: int = 12,
    cell_types: Sequence[str] = ("K562", "HepG2"),
    batches: int = 3,
    seed: int = 0,
    density: float = 0.1,
    control_fraction: float = 0.15,
    obsm_dim: int = 16,
    legacy: bool = False,
    *,
    dense: bool = False,
    normalized: bool = False,
) -> Path:
    """A scPerturb-style h5ad via anndata itself; batch and timepoint stay plain string columns."""
    path = Path(path)
    args = (
        n_cells,
        n_genes,
        n_perts,
        cell_types,
        batches,
        seed,
        density,
        control_fraction,
        obsm_dim,
    )
    if legacy:
        return write_legacy_h5ad(path, *args, dense=dense, normalized=normalized)
    adata = make_perturb_adata(*args, normalized=normalized)
    if dense:
        adata.X = adata.X.toarray()
    path.parent.mkdir(parents=True, exist_ok=True)
    adata.write_h5ad(path, convert_strings_to_categoricals=False)
    return path


def _write_h5sparse(parent: h5py.Group, name: str, matrix: sp.csr_matrix) -> None:
    """anndata < 0.7 stored sparse matrices through h5sparse: a group tagged with format and shape
    attrs."""
    group = parent.create_group(name)
    group.attrs["h5sparse_format"] = "csr"
    group.attrs["h5sparse_shape"] = np.asarray(matrix.shape, dtype=np.int64)
    group.create_dataset("data", data=matrix.data)
    group.create_dataset("indices", data=matrix.indices)
    group.create_dataset("indptr", data=matrix.indptr)


def _legacy_table(
    frame: pd.DataFrame, plain: Sequence[str] = ()
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """anndata 0.6's df_to_records_fixed_width: index first, categoricals as pandas codes,
    categories to uns."""
    fields: list[tuple[str, object]] = [("index", STR)]
    columns: list[np.ndarray] = [frame.index.to_numpy(dtype=object)]
    uns: dict[str, np.ndarray] = {}
    for name in frame.columns:
        values = frame[name]
        if name in plain:
            fields.append((name, STR))
            columns.append(values.astype(str).to_numpy(dtype=object))
        elif isinstance(values.dtype, pd.CategoricalDtype) or values.dtype == object:
            cat = pd.Categorical(values)  # strings_to_categoricals: sorted categories
            uns[f"{name}_categories"] = cat.categories.to_numpy(dtype=object)
            fields.append((name, cat.codes.dtype))
            columns.append(cat.codes)
        else:
            fields.append((name, values.dtype))
            columns.append(values.to_numpy())
    table = np.empty(len(frame), dtype=fields)
    for (name, _), column in zip(fields, columns, strict=True):
        table[name] = column
    return table, uns


def write_legacy_h5ad(
    path: str | Path,
    n_cells: int = 2000,
    n_genes: int = 500,
    n_perts: int = 12,
    cell_types: Sequence[str] = ("K562", "HepG2"),
    batches: int = 3,
    seed: int = 0,
    density: float = 0.1,
    control_fraction: float = 0.15,
    obsm_dim: int = 16,
    *,
    dense: bool = False,
    normalized: bool = False,
    obsm_layout: Literal["group", "compound"] = "group",
) -> Path:
    """The same screen in the pre-0.7 layout, written with raw h5py as anndata 0.6 laid it out.

    obs/var are compound tables (index field first), categorical obs columns hold int codes with
    their categories in uns/<col>_categories, sparse matrices are h5sparse groups and raw lives
    in raw.X / raw.var. `timepoint` is kept as a plain string field so readers meet both column
    kinds. obsm is a group of datasets (0.6.2x) or, with obsm_layout="compound", one record array
    (earlier 0.6 releases).
    """
    path = Path(path)
    adata = make_perturb_adata(
        n_cells,
        n_genes,
        n_perts,
        cell_types,
        batches,
        seed,
        density,
        control_fraction,
        obsm_dim,
        normalized=normalized,
    )
    obs, uns = _legacy_table(adata.obs, plain=("timepoint",))
    var, _ = _legacy_table(adata.var)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        if dense:
            f.create_dataset("X", data=adata.X.toarray())
        else:
            _write_h5sparse(f, "X", adata.X)
        f.create_dataset("obs", data=obs)
        f.create_dataset("var", data=var)
        for key, categories in uns.items():
            f.create_dataset(f"uns/{key}", data=categories, dtype=STR)
        pca = adata.obsm["X_pca"]
        if obsm_layout == "compound":
            record = np.empty(n_cells, dtype=[("X_pca", pca.dtype, pca.shape[1:])])
            record["X_pca"] = pca
            f.create_dataset("obsm", data=record)
        else:
            f.create_dataset("obsm/X_pca", data=pca)
        if normalized:
            _write_h5sparse(f.create_group("layers"), "counts", adata.layers["counts"])
            _write_h5sparse(f, "raw.X", adata.raw.X)
            f.create_dataset("raw.var", data=_legacy_table(adata.raw.var)[0])
    return path


def write_h5csr(
    path: str | Path,
    n_cells: int = 2000,
    n_genes: int = 500,
    n_perts: int = 12,
    batches: int = 3,
    seed: int = 0,
    density: float = 0.1,
    control_fraction: float = 0.15,
    hvg_dim: int = 32,
    var_key: str = "_index",
) -> Path:
    """A STATE / cell-load style file: one cell line per file (named by the stem), codes/categories
    obs groups.

    Perturbations go to obs/gene with control "non-targeting" and byte-string categories, batches to
    obs/gem_group with str categories; there is no cell_type column; obsm/X_hvg is dense.
    """
    path = Path(path)
    adata = make_perturb_adata(
        n_cells,
        n_genes,
        n_perts,
        (path.stem,),
        batches,
        seed,
        density,
        control_fraction,
        1,
        control_label="non-targeting",
    )
    gene = adata.obs["perturbation"].cat
    gem = pd.Categorical(adata.obs["batch"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        x = f.create_group("X")
        x.attrs["encoding-type"] = "csr_matrix"
        x.attrs["encoding-version"] = "0.1.0"
        x.attrs["shape"] = np.asarray(adata.shape, dtype=np.int64)
        for name in ("data", "indices", "indptr"):
            x.create_dataset(name, data=getattr(adata.X, name))
        f.create_dataset("obs/gene/codes", data=gene.codes.to_numpy())
        f.create_dataset("obs/gene/categories", data=np.asarray(gene.categories, dtype="S"))
        f.create_dataset("obs/gem_group/codes", data=gem.codes)
        f.create_dataset(
            "obs/gem_group/categories", data=gem.categories.to_numpy(dtype=object), dtype=STR
        )
        f.create_dataset("obs/_index", data=adata.obs_names.to_numpy(dtype=object), dtype=STR)
        f.create_dataset("obsm/X_hvg", data=hvg_embedding(adata.X, hvg_dim))
        f.create_dataset(f"var/{var_key}", data=adata.var_names.to_numpy(dtype=object), dtype=STR)
    return path


def write_perturbation_demo(root: str | Path) -> list[Path]:
    """A small mixed corpus: three scPerturb screens (CSR, dense X, legacy layout) and two STATE
    cell lines."""
    root = Path(root)
    perturb, state = root / "perturb", root / "state"
    return [
        write_perturb_h5ad(
            perturb / "screen_a.h5ad", n_cells=2000, n_genes=600, n_perts=12, seed=1
        ),
        write_perturb_h5ad(
            perturb / "screen_b.h5ad",
            n_cells=1500,
            n_genes=600,
            n_perts=8,
            cell_types=("HepG2",),
            seed=2,
            dense=True,
        ),
        write_perturb_h5ad(
            perturb / "screen_c.h5ad",
            n_cells=2500,
            n_genes=600,
            n_perts=16,
            cell_types=("K562", "RPE1"),
            seed=3,
            legacy=True,
        ),
        write_h5csr(state / "hepg2.h5", n_cells=1800, n_genes=600, n_perts=10, seed=4),
        write_h5csr(
            state / "jurkat.h5", n_cells=2200, n_genes=600, n_perts=10, seed=5, var_key="gene_name"
        ),
    ]
