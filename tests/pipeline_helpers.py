"""Small datasets and manifests for pipeline tests, written the way real producers write them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import scipy.sparse as sp

from loaders import format as fmt
from loaders.shardio import read_shard

MANIFEST = """
[dataset]
name = "{name}"
kind = "perturbation"
format = "zarr"
seed = {seed}
shard_size_mb = {shard_mb}
block_rows = {block_rows}

[[sources]]
path = "{pattern}"
type = "{type}"

[fields]
perturbation = "{pert}"
control = ["control", "non-targeting"]
cell_type = "cell_type"
batch = "{batch}"
covariates = {covariates}
values = "counts"
obsm = {obsm}

[pairing]
strategy = "{strategy}"
max_pairs_per_condition = {max_pairs}
sentence_size = {sentence_size}

[split]
mode = "{split}"
val_fraction = 0.1
test_fraction = 0.2
"""


def write_manifest(path: Path, **kw: Any) -> Path:
    params = dict(name="t", seed=0, shard_mb=0.05, block_rows=97, pattern="src/*.h5ad", type="h5ad",
                  pert="perturbation", batch="batch", covariates='["timepoint"]', obsm='["X_pca"]',
                  strategy="batch", max_pairs=500, sentence_size=8, split="random")
    params.update(kw)
    path.write_text(MANIFEST.format(**params))
    return path


def read_all(out: Path) -> tuple[fmt.Index, list[tuple[fmt.ShardEntry, dict[str, np.ndarray]]]]:
    index = fmt.read_index(out)
    keys = fmt.shard_keys(index.fields, index.tables)
    return index, [(e, read_shard(index.shard_path(e), index.encoding, keys)) for e in index.shards]


def shard_csr(cols: dict[str, np.ndarray], n_cols: int) -> sp.csr_matrix:
    n = cols[fmt.SAMPLE_ID].size
    return sp.csr_matrix((cols["X/data"], cols["X/indices"], cols["X/indptr"]), shape=(n, n_cols))


def source_matrix(paths: list[Path]) -> tuple[sp.csr_matrix, list[Any]]:
    """All sources concatenated in manifest order (the sample_id space), read fully (tests only)."""
    mats, obs = [], []
    for p in paths:
        a = ad.read_h5ad(p)
        mats.append(sp.csr_matrix(a.X, dtype=np.float32))
        obs.append(a.obs)
    return sp.vstack(mats).tocsr(), obs


def shard_files(out: Path) -> dict[str, tuple[int, int]]:
    """name -> (inode, mtime_ns) of every file inside every shard (to prove a shard was not rewritten)."""
    res = {}
    for p in sorted((out / fmt.SHARDS_DIR).rglob("*")):
        if p.is_file():
            st = p.stat()
            res[str(p.relative_to(out))] = (st.st_ino, st.st_mtime_ns)
    return res
