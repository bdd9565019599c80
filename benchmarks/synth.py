"""Synthetic scPerturb-like datasets: sparse negative-binomial counts plus perturbation metadata, as
.h5ad.

The CSR matrix is built directly from per-row nonzero counts and random column draws (never a
dense matrix), so 200,000 cells x 2,000 genes generate in a few seconds. Generated files are
cached under a data folder, keyed by every parameter, and reused by later runs (a ``params.json``
written last marks a complete set).

    python -m benchmarks.synth --cells 200000 --genes 2000 --files 1 --data-dir bench_data
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

CONTROL = "control"
PARAMS_FILE = "params.json"
CACHE_VERSION = 2  # bump when the generator changes, so stale caches are not reused


@dataclass(frozen=True)
class SynthParams:
    n_cells: int = 200_000
    n_genes: int = 2_000
    density: float = 0.10  # expected fraction of nonzero entries
    n_perturbations: int = 200
    control_fraction: float = 0.10
    n_cell_types: int = 5
    n_batches: int = 8
    n_timepoints: int = 4
    n_files: int = 1  # rows are split into this many contiguous .h5ad files
    seed: int = 0
    # Generate and write one file at a time (memory: one file's matrix, not the whole screen's; the
    # 2M-cell scale bench needs this). Other draws than the whole-matrix generator, so its own cache
    # key.
    per_file: bool = False

    def key(self) -> str:
        doc = asdict(self)
        if (
            not self.per_file
        ):  # keys of the whole-matrix datasets stay as they were (their caches stay valid)
            doc.pop("per_file")
        blob = json.dumps({**doc, "v": CACHE_VERSION}, sort_keys=True).encode()
        return f"synth_c{self.n_cells}_g{self.n_genes}_f{self.n_files}_{hashlib.sha256(blob).hexdigest()[:10]}"

    @property
    def n_categories(self) -> dict[str, int]:
        return {
            "perturbation": self.n_perturbations + 1,
            "cell_type": self.n_cell_types,
            "batch": self.n_batches,
            "timepoint": self.n_timepoints,
        }


@dataclass(frozen=True)
class SynthDataset:
    params: SynthParams
    folder: Path
    files: tuple[Path, ...]
    nnz: int
    csr_bytes: int  # X/data + X/indices + X/indptr as stored in the files
    file_bytes: int
    generate_s: float  # 0.0 when served from the cache

    @property
    def glob(self) -> str:
        return str(self.folder / "part_*.h5ad")

    def to_json(self) -> dict[str, object]:
        return {
            **asdict(self.params),
            "folder": str(self.folder),
            "files": [str(f) for f in self.files],
            "nnz": self.nnz,
            "nnz_fraction": self.nnz / max(1, self.params.n_cells * self.params.n_genes),
            "csr_bytes": self.csr_bytes,
            "file_bytes": self.file_bytes,
            "generate_s": self.generate_s,
        }


def random_csr(
    n_rows: int,
    n_cols: int,
    density: float,
    rng: np.random.Generator,
    gene_mean: np.ndarray | None = None,
) -> sp.csr_matrix:
    """float32 CSR with ~density nonzeros per row; values are 1 + NB(r=1) counts with a per-gene,
    per-cell mean."""
    if gene_mean is None:
        gene_mean = rng.lognormal(0.0, 1.0, n_cols)
    size_factor = rng.lognormal(0.0, 0.3, n_rows)
    size_factor /= size_factor.mean()
    row_density = np.clip(density * size_factor, 0.0, 0.95)
    target = rng.binomial(n_cols, row_density)
    # Draws with replacement that leave `target` distinct columns on average: k = -n ln(1 - d/n).
    draws = np.rint(-n_cols * np.log1p(-target / n_cols)).astype(np.int64)
    rows = np.repeat(np.arange(n_rows, dtype=np.int64), draws)
    keys = rows * n_cols + rng.integers(0, n_cols, rows.size, dtype=np.int64)
    del rows
    keys.sort()
    if keys.size:
        keep = np.empty(keys.size, dtype=bool)
        keep[0] = True
        np.not_equal(keys[1:], keys[:-1], out=keep[1:])
        keys = keys[keep]
        del keep
    row_of = keys // n_cols
    indices = (keys - row_of * n_cols).astype(np.int32)
    del keys
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row_of, minlength=n_rows), out=indptr[1:])
    mu = gene_mean[indices] * size_factor[row_of]
    del row_of
    # 1 + NB(r=1, mean mu) == Geometric(1 / (1 + mu)) on {1, 2, ...}: the fastest NB draw numpy has.
    data = rng.geometric(1.0 / (1.0 + mu)).astype(np.float32)
    return sp.csr_matrix((data, indices, indptr), shape=(n_rows, n_cols))


def random_obs(p: SynthParams, rng: np.random.Generator) -> pd.DataFrame:
    n = p.n_cells
    perts = [CONTROL] + [f"PERT_{i:04d}" for i in range(p.n_perturbations)]
    is_ctrl = rng.random(n) < p.control_fraction
    pert = (
        np.where(is_ctrl, 0, rng.integers(1, p.n_perturbations + 1, n))
        if p.n_perturbations
        else np.zeros(n, int)
    )

    def cat(codes: np.ndarray, names: list[str]) -> pd.Categorical:
        return pd.Categorical.from_codes(codes.astype(np.int32), categories=names)

    obs = pd.DataFrame(
        {
            "perturbation": cat(pert, perts),
            "cell_type": cat(
                rng.integers(0, p.n_cell_types, n), [f"CT{i}" for i in range(p.n_cell_types)]
            ),
            "batch": cat(rng.integers(0, p.n_batches, n), [f"B{i}" for i in range(p.n_batches)]),
            "timepoint": cat(
                rng.integers(0, p.n_timepoints, n), [f"T{i}" for i in range(p.n_timepoints)]
            ),
        }
    )
    obs.index = pd.Index([f"cell{i:07d}" for i in range(n)], dtype=object)
    return obs


def knockdown(x: sp.csr_matrix, obs: pd.DataFrame, n_genes: int, rng: np.random.Generator) -> None:
    """Each perturbation knocks down one target gene in its cells (in place; values stay >= 1)."""
    codes = obs["perturbation"].cat.codes.to_numpy()
    targets = np.concatenate([[-1], rng.integers(0, n_genes, max(0, codes.max()))])
    per_entry = np.repeat(targets[codes], np.diff(x.indptr))
    hit = per_entry == x.indices
    x.data[hit] = np.maximum(1.0, np.floor(x.data[hit] * 0.25))


def generate(
    p: SynthParams, part: int | None = None
) -> tuple[sp.csr_matrix, pd.DataFrame, pd.DataFrame]:
    """The whole matrix, or (`part`) one file of a per-file dataset: the genes' means and the
    knockdown targets come from the seed alone, so every file shares them; the cells are drawn
    from (seed, part)."""
    rng = np.random.default_rng(p.seed)
    gene_mean = rng.lognormal(0.0, 1.0, p.n_genes)
    if part is not None:
        targets_rng = np.random.default_rng([p.seed, 1 << 20])
        rng = np.random.default_rng([p.seed, part])
        obs = random_obs(p, rng)
        x = random_csr(p.n_cells, p.n_genes, p.density, rng, gene_mean)
        knockdown(x, obs, p.n_genes, targets_rng)
        var = pd.DataFrame(index=pd.Index([f"GENE{i:05d}" for i in range(p.n_genes)], dtype=object))
        return x, obs, var
    obs = random_obs(p, rng)
    x = random_csr(p.n_cells, p.n_genes, p.density, rng, gene_mean)
    knockdown(x, obs, p.n_genes, rng)
    var = pd.DataFrame(index=pd.Index([f"GENE{i:05d}" for i in range(p.n_genes)], dtype=object))
    return x, obs, var


def write_h5ad(path: Path, x: sp.csr_matrix, obs: pd.DataFrame, var: pd.DataFrame) -> None:
    import anndata

    tmp = path.with_name(f".{path.name}.tmp")
    anndata.AnnData(X=x, obs=obs, var=var).write_h5ad(tmp)
    os.replace(tmp, path)


def csr_nbytes(path: Path) -> int:
    """Bytes of X/data + X/indices + X/indptr as stored in an .h5ad (what a reader must move)."""
    import h5py

    with h5py.File(path, "r") as f:
        return int(sum(f["X"][k].nbytes for k in ("data", "indices", "indptr")))


def split_rows(n: int, k: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, k + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def ensure_dataset(p: SynthParams, data_dir: str | Path, log: bool = True) -> SynthDataset:
    """Return the cached dataset for these parameters, generating it first if needed."""
    folder = Path(data_dir) / p.key()
    marker = folder / PARAMS_FILE
    if marker.exists():
        meta = json.loads(marker.read_text())
        files = tuple(folder / f for f in meta["files"])
        if all(f.exists() for f in files):
            return SynthDataset(
                p, folder, files, meta["nnz"], meta["csr_bytes"], meta["file_bytes"], 0.0
            )
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    files = []
    if p.per_file:
        nnz = 0
        for i, (a, b) in enumerate(split_rows(p.n_cells, p.n_files)):
            x, obs, var = generate(replace(p, n_cells=b - a, n_files=1, per_file=False), part=i)
            obs.index = pd.Index([f"cell{j:07d}" for j in range(a, b)], dtype=object)
            f = folder / f"part_{i:02d}.h5ad"
            write_h5ad(f, x, obs, var)
            files.append(f)
            nnz += int(x.nnz)
            del x, obs
    else:
        x, obs, var = generate(p)
        nnz = int(x.nnz)
        for i, (a, b) in enumerate(split_rows(p.n_cells, p.n_files)):
            f = folder / f"part_{i:02d}.h5ad"
            write_h5ad(f, x[a:b], obs.iloc[a:b], var)
            files.append(f)
    dt = time.perf_counter() - t0
    csr_bytes = sum(csr_nbytes(f) for f in files)
    file_bytes = sum(f.stat().st_size for f in files)
    meta = {
        "params": asdict(p),
        "files": [f.name for f in files],
        "nnz": nnz,
        "csr_bytes": csr_bytes,
        "file_bytes": file_bytes,
        "generate_s": dt,
    }
    marker.write_text(json.dumps(meta, indent=1))
    if log:
        print(
            f"[synth] {p.n_cells} x {p.n_genes} in {p.n_files} file(s): {nnz} nnz, {dt:.1f}s -> {folder}",
            flush=True,
        )
    return SynthDataset(p, folder, tuple(files), nnz, csr_bytes, file_bytes, dt)


def copy_dataset(ds: SynthDataset, dest: str | Path) -> SynthDataset:
    """A private copy (for runs that modify a file); the cache stays pristine."""
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    files = []
    for f in ds.files:
        shutil.copyfile(f, dest / f.name)
        files.append(dest / f.name)
    return replace(ds, folder=dest, files=tuple(files), generate_s=0.0)


def rewrite_changed_values(path: str | Path, seed: int = 1) -> float:
    """Rewrite one .h5ad with new count values (same obs, same sparsity pattern). Returns seconds
    taken."""
    import anndata

    t0 = time.perf_counter()
    path = Path(path)
    ad = anndata.read_h5ad(path)
    x = sp.csr_matrix(ad.X)
    rng = np.random.default_rng(seed)
    x.data = (x.data + rng.integers(0, 3, x.data.size)).astype(np.float32)
    write_h5ad(path, x, ad.obs, ad.var)
    return time.perf_counter() - t0


def manifest_text(
    sources_glob: str,
    *,
    name: str,
    codec: str,
    sentence_size: int = 128,
    shard_size_mb: float = 64,
    max_pairs_per_condition: int = 500,
    seed: int = 0,
) -> str:
    """A perturbation manifest for a synthetic dataset (source path absolute, so it can live
    anywhere)."""
    return f"""[dataset]
name = "{name}"
kind = "perturbation"
format = "zarr"
seed = {seed}
shard_size_mb = {shard_size_mb}
codec = "{codec}"

[[sources]]
path = {json.dumps(sources_glob)}
type = "h5ad"

[fields]
perturbation = "perturbation"
control = ["{CONTROL}"]
cell_type = "cell_type"
batch = "batch"
covariates = ["timepoint"]
values = "counts"

[pairing]
strategy = "batch"
max_pairs_per_condition = {max_pairs_per_condition}
sentence_size = {sentence_size}

[split]
mode = "random"
val_fraction = 0.1
test_fraction = 0.1
"""


def write_manifest(path: str | Path, ds: SynthDataset, **kwargs: object) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(manifest_text(ds.glob, **kwargs))  # type: ignore[arg-type]
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cells", type=int, default=SynthParams.n_cells)
    ap.add_argument("--genes", type=int, default=SynthParams.n_genes)
    ap.add_argument("--density", type=float, default=SynthParams.density)
    ap.add_argument("--perturbations", type=int, default=SynthParams.n_perturbations)
    ap.add_argument("--files", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--per-file", action="store_true", help="generate one file at a time (big screens)"
    )
    ap.add_argument("--data-dir", default="bench_data")
    a = ap.parse_args(argv)
    p = SynthParams(
        n_cells=a.cells,
        n_genes=a.genes,
        density=a.density,
        n_perturbations=a.perturbations,
        n_files=a.files,
        seed=a.seed,
        per_file=a.per_file,
    )
    ds = ensure_dataset(p, a.data_dir)
    print(json.dumps(ds.to_json(), indent=1))


if __name__ == "__main__":
    main()
