"""`shardsmith export`: one split of a perturbation dataset as an AnnData `.h5ad`, for scanpy.

What it writes, row for row equal to the source rows the shards hold: ``X`` (CSR float32, genes
as ``var_names``), ``obs`` indexed by the cells' barcodes (the sources' obs_names) with
``sample_id``, ``split``, ``cond_id`` and every obs field as a categorical over the dataset's
full vocabulary (so codes agree with ``batch["perturbation"]`` and across splits),
``obsm["cond"]`` (the condition vectors a loader batch carries) and the stored ``obsm``
embeddings. Rows are in ``sample_id`` order (the sources' concatenated order).

Barcodes are made unique the way anndata's ``obs_names_make_unique`` does (a repeat gets ``-1``,
``-2``...): two source files often share cell names (each run starts at ``AAAC...-1``), and an
AnnData with repeated obs_names warns on every read and breaks joins on them. The barcodes as the
sources name them are kept in ``obs["original_obs_name"]``.

``sample`` picks the records: ``cells`` the split's primary cells (each once); ``pairs`` /
``sentences`` every record their units refer to (matched controls duplicated into the split
included, each once), with a ``primary`` obs column. The split is held in memory (a few hundred
MB per million cells at 5 % density).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders import format as fmt
from loaders.format.readers import read_shard
from loaders.interop import decode_names, splits, var_names
from pipeline.errors import DatasetError
from pipeline.model import open_index

if TYPE_CHECKING:
    import anndata as ad  # import weight: only export writes AnnData

log = logging.getLogger(__name__)
ORIGINAL_NAMES = "original_obs_name"  # obs column: the barcodes as the sources name them
SAMPLES = {
    "cells": (),
    "pairs": (fmt.PAIRS,),
    "sentences": (fmt.SENTENCES_PERT, fmt.SENTENCES_CTRL),
}


def _rows_of(cols: dict[str, np.ndarray], sample: str) -> np.ndarray:
    """Local rows of one shard that ``sample`` exports."""
    if sample == "cells":
        return (
            np.flatnonzero(cols[fmt.PRIMARY])
            if fmt.PRIMARY in cols
            else np.arange(cols[fmt.SAMPLE_ID].size)
        )
    return np.unique(np.concatenate([cols[t].ravel() for t in SAMPLES[sample]]).astype(np.int64))


def to_anndata(root: str | Path, split: str, sample: str = "cells") -> ad.AnnData:
    import anndata as ad  # import weight: only export writes AnnData
    import pandas as pd  # import weight: only export needs pandas
    import scipy.sparse as sp  # import weight: the CLI imports this module to list commands

    index = open_index(root)  # with the plug-ins it names (a plug-in's field codec, say)
    if index.kind != "perturbation" or not index.has_field(fmt.X):
        raise DatasetError(
            f"{index.root}: export writes cell x gene datasets (kind perturbation); this one is "
            f"{index.kind!r}"
        )
    if split not in splits(index):
        raise DatasetError(
            f"{index.root}: no split {split!r} (splits: {', '.join(splits(index))}); pick one with --split"
        )
    if sample not in SAMPLES:
        raise DatasetError(f"--sample {sample!r}: one of {', '.join(SAMPLES)}")
    missing = [t for t in SAMPLES[sample] if t not in index.tables]
    if missing:
        raise DatasetError(
            f"{index.root}: --sample {sample} needs tables {missing}, which this dataset lacks"
        )
    n_genes = index.field(fmt.X).shape[0]
    obs_fields = [f for f in index.obs_fields if index.has_field(fmt.OBS_PREFIX + f)]
    obsm_keys = sorted(f.name for f in index.fields if f.name.startswith(fmt.OBSM_PREFIX))
    has_names = index.has_field(fmt.OBS_NAMES)
    keys = [
        *fmt.csr_keys(fmt.X),
        fmt.SAMPLE_ID,
        *(k for k in (fmt.PRIMARY, fmt.COND_ID) if index.has_field(k)),
        *(fmt.OBS_PREFIX + f for f in obs_fields),
        *obsm_keys,
        *SAMPLES[sample],
        *(fmt.ragged_keys(fmt.OBS_NAMES) if has_names else ()),
    ]
    parts: dict[str, list[Any]] = {}
    for entry in index.shards_of(split):
        cols = read_shard(index.shard_path(entry), index.encoding, keys)
        rows = _rows_of(cols, sample)
        ptr, idx, data = (cols[k] for k in fmt.csr_keys(fmt.X))
        parts.setdefault("X", []).append(
            sp.csr_matrix((data, idx, ptr), shape=(ptr.size - 1, n_genes))[rows]
        )
        for k in keys[3:]:
            if k in SAMPLES[sample] or k.startswith(fmt.OBS_NAMES):
                continue
            parts.setdefault(k, []).append(cols[k][rows])
        if has_names:
            off, val = fmt.ragged_keys(fmt.OBS_NAMES)
            parts.setdefault(fmt.OBS_NAMES, []).append(decode_names(cols[off], cols[val])[rows])
    ids = np.concatenate(parts[fmt.SAMPLE_ID])
    order = np.argsort(ids, kind="stable")
    col = {k: np.concatenate(v)[order] for k, v in parts.items() if k != "X"}
    x = sp.vstack(parts["X"], format="csr")[order]
    x.sort_indices()
    obs = pd.DataFrame(
        {"sample_id": col[fmt.SAMPLE_ID], "split": pd.Categorical([split] * ids.size)}
    )
    for f in obs_fields:
        obs[f] = pd.Categorical.from_codes(
            col[fmt.OBS_PREFIX + f], categories=index.vocabularies[f]
        )
    if fmt.COND_ID in col:
        obs["cond_id"] = col[fmt.COND_ID]
    if sample != "cells" and fmt.PRIMARY in col:
        obs["primary"] = col[fmt.PRIMARY]
    names = col[fmt.OBS_NAMES] if has_names else col[fmt.SAMPLE_ID].astype(str)
    original = pd.Index(np.asarray(names, dtype=object).astype(str))
    obs[ORIGINAL_NAMES] = original.to_numpy()
    obs.index = ad.utils.make_index_unique(original)  # anndata's own rule: a, a-1, a-2, ...
    if not original.is_unique:
        log.warning(
            "%s: %d cells share a barcode with an earlier one (sources with the same cell "
            "names): made unique as anndata's obs_names_make_unique does; the originals are in "
            "obs[%r]",
            index.root,
            int(original.duplicated().sum()),
            ORIGINAL_NAMES,
        )
    obsm = {k[len(fmt.OBSM_PREFIX) :]: col[k] for k in obsm_keys}
    vectors = _condition_vectors(index)
    if vectors is not None and fmt.COND_ID in col:
        obsm["cond"] = vectors[col[fmt.COND_ID]]
    var = pd.DataFrame(index=pd.Index(var_names(index) or [str(i) for i in range(n_genes)]))
    return ad.AnnData(
        X=x,
        obs=obs,
        var=var,
        obsm=obsm,
        uns={
            "shardsmith": {
                "dataset": index.name,
                "split": split,
                "sample": sample,
                "condition_segments": [str(s) for s in index.conditions.segments]
                if index.conditions is not None
                else [],
            }
        },
    )


def _condition_vectors(index: fmt.Index) -> np.ndarray | None:
    cond = index.conditions
    if cond is None:
        return None
    path = index.root / cond.file
    encoding = "zarr" if path.is_dir() else index.encoding
    return np.asarray(
        read_shard(path, encoding, [fmt.CONDITION_VECTORS])[fmt.CONDITION_VECTORS], np.float32
    )


def export(root: str | Path, split: str, out: str | Path, sample: str = "cells") -> Path:
    """Write the split as ``out`` (.h5ad), atomically (a temporary name, then a rename)."""
    out = Path(out)
    if out.suffix != ".h5ad":
        raise DatasetError(f"{out}: the output is an .h5ad file (name it OUT.h5ad)")
    adata = to_anndata(root, split, sample)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.h5ad")
    try:
        adata.write_h5ad(tmp)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
