"""The synthetic perturbation screen in memory (an AnnData), seeded: the content every writer of
:mod:`pipeline.modalities.perturbation.demo` puts on disk, and what a test rebuilds to check a
reader against instead of trusting the reader to check itself."""

from __future__ import annotations

from collections.abc import Sequence

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

TIMEPOINTS = ("d1", "d3")


def make_gene_names(n_genes: int) -> np.ndarray:
    return np.char.add("G", np.char.zfill(np.arange(n_genes).astype(str), 5)).astype(object)


def make_perturb_obs(
    n_cells: int,
    n_perts: int,
    rng: np.random.Generator,
    gene_names: np.ndarray,
    cell_types: Sequence[str] = ("K562", "HepG2"),
    batches: int = 3,
    control_fraction: float = 0.15,
    control_label: str = "control",
) -> tuple[pd.DataFrame, np.ndarray]:
    """obs with perturbations targeting real gene names, plus each cell's target gene index (-1 =
    control).

    Every column is drawn independently per cell, so rows come out interleaved rather than
    grouped by perturbation, as in a pooled screen: the planner must not rely on input order.
    """
    targets = rng.choice(len(gene_names), size=min(n_perts, len(gene_names)), replace=False)
    pick = rng.integers(0, len(targets), size=n_cells)
    is_control = rng.random(n_cells) < control_fraction
    target_of_cell = np.where(is_control, -1, targets[pick])
    labels = np.where(is_control, control_label, gene_names[targets][pick]).astype(object)
    obs = pd.DataFrame(
        {
            "perturbation": pd.Categorical(labels),
            "cell_type": pd.Categorical(
                np.asarray(cell_types, dtype=object)[rng.integers(0, len(cell_types), n_cells)]
            ),
            "batch": np.char.add("b", rng.integers(0, batches, n_cells).astype(str)).astype(object),
            "timepoint": np.asarray(TIMEPOINTS, dtype=object)[
                rng.integers(0, len(TIMEPOINTS), n_cells)
            ],
        },
        index=pd.Index(
            np.char.add("cell", np.char.zfill(np.arange(n_cells).astype(str), 7)).astype(object)
        ),
    )
    return obs, target_of_cell


def _geometric_draws(rng: np.random.Generator, n: int, scale: np.ndarray | float) -> np.ndarray:
    """Geometric failure counts as float32: floor(Exp(1) * scale), where scale = -1 / log(1 -
    p_success).

    In place and in float32 because numpy's own geometric sampler (and every fresh temporary) costs
    seconds at the 40M draws of a 200k-cell file.
    """
    draws = rng.standard_exponential(n, dtype=np.float32)
    np.multiply(draws, scale, out=draws)
    return np.floor(draws, out=draws)


def _bernoulli_positions(rng: np.random.Generator, total: int, density: float) -> np.ndarray:
    """Sorted distinct flat positions, each kept with probability `density`: cumulative geometric
    gaps.

    Yields every row's columns already sorted and unique, with no sort and no dense mask.
    """
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density}")
    if density == 1:
        return np.arange(total, dtype=np.int64)
    scale = np.float32(-1.0 / np.log1p(-density))
    expected = total * density
    chunks, end = [np.empty(0, dtype=np.int64)], -1
    while end < total - 1:
        n = (
            int(expected + 6 * np.sqrt(expected) + 64)
            if len(chunks) == 1
            else int(expected * 0.01 + 1024)
        )
        steps = _geometric_draws(rng, n, scale).astype(np.int64)
        steps += 1
        steps[0] += end
        chunks.append(np.cumsum(steps, out=steps))
        end = int(steps[-1])
    pos = np.concatenate(chunks) if len(chunks) > 2 else chunks[-1]
    return pos[: np.searchsorted(pos, total)]


def make_counts(
    n_cells: int,
    n_genes: int,
    rng: np.random.Generator,
    density: float,
    target_of_cell: np.ndarray | None = None,
) -> sp.csr_matrix:
    """Negative-binomial counts built straight into CSR: a dense 200k x 2000 intermediate would be
    1.6 GB.

    Which entries are stored is a Bernoulli(density) draw per (cell, gene); stored values are 1 +
    NB(r=1) with a log-normal mean per gene, so no explicit zeros are stored and highly expressed
    genes stand out.
    """
    pos = _bernoulli_positions(rng, n_cells * n_genes, density)
    indptr = np.searchsorted(pos, np.arange(n_cells + 1, dtype=np.int64) * n_genes).astype(np.int64)
    cols = (pos % n_genes).astype(np.int32)
    gene_mean = rng.lognormal(mean=0.5, sigma=1.0, size=n_genes)
    gene_scale = (-1.0 / np.log1p(-1.0 / (1.0 + gene_mean))).astype(
        np.float32
    )  # success p = 1 / (1 + mean)
    values = _geometric_draws(rng, pos.size, gene_scale[cols])
    values += 1
    if target_of_cell is not None:  # knockdown: the targeted gene keeps a quarter of its counts
        cells = np.flatnonzero(target_of_cell >= 0)
        keys = cells * n_genes + target_of_cell[cells]
        at = np.minimum(np.searchsorted(pos, keys), max(pos.size - 1, 0))
        hit = at[pos[at] == keys] if pos.size else at[:0]
        values[hit] = np.maximum(1, values[hit] // 4)
    return sp.csr_matrix((values, cols, indptr), shape=(n_cells, n_genes))


def log_normalize(counts: sp.csr_matrix, target_sum: float = 1e4) -> sp.csr_matrix:
    """What most h5ad producers leave in X when the counts move to layers['counts'] / raw."""
    totals = np.asarray(counts.sum(axis=1)).ravel()
    scale = np.divide(target_sum, totals, out=np.zeros_like(totals), where=totals > 0)
    out = counts.copy()
    out.data = np.log1p(out.data * np.repeat(scale, np.diff(counts.indptr))).astype(np.float32)
    return out


def hvg_embedding(counts: sp.csr_matrix, dim: int) -> np.ndarray:
    """cell-load's X_hvg: dense log1p expression of the `dim` most expressed genes."""
    top = np.sort(np.argsort(-np.asarray(counts.sum(axis=0)).ravel(), kind="stable")[:dim])
    return np.log1p(counts[:, top].toarray()).astype(np.float32)


def make_perturb_adata(
    n_cells: int = 2000,
    n_genes: int = 500,
    n_perts: int = 12,
    cell_types: Sequence[str] = ("K562", "HepG2"),
    batches: int = 3,
    seed: int = 0,
    density: float = 0.1,
    control_fraction: float = 0.15,
    obsm_dim: int = 16,
    control_label: str = "control",
    normalized: bool = False,
) -> ad.AnnData:
    """The in-memory screen every writer of `demo` puts on disk. normalized: X log-normalised,
    counts in layers + raw."""
    rng = np.random.default_rng(seed)
    genes = make_gene_names(n_genes)
    obs, target_of_cell = make_perturb_obs(
        n_cells, n_perts, rng, genes, cell_types, batches, control_fraction, control_label
    )
    counts = make_counts(n_cells, n_genes, rng, density, target_of_cell)
    offsets = rng.normal(size=(len(obs["perturbation"].cat.categories), obsm_dim))
    pca = offsets[obs["perturbation"].cat.codes.to_numpy()] + rng.normal(
        scale=0.5, size=(n_cells, obsm_dim)
    )
    adata = ad.AnnData(
        X=counts,
        obs=obs,
        var=pd.DataFrame(index=pd.Index(genes)),
        obsm={"X_pca": pca.astype(np.float32)},
    )
    if normalized:
        adata.layers["counts"] = counts.copy()
        adata.raw = adata
        adata.X = log_normalize(counts)
    return adata
