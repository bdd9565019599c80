"""Datasets written straight through the shard writer: ``build_dataset(root, "shards", ...)`` of
tests/conftest.py, for the loader tests. ``write_shards`` writes shards of random CSR cells (with
controls duplicated across shards, pairs and sentences), a condition table and an ``index.json``
as a build writes them, and keeps every column written; ``Truth`` is what was written, by
sample_id, to compare with what a loader yields. A pytest plug-in, registered by tests/conftest.py
(``pytest_plugins``) and imported by it where used; tests reach it through the ``build_dataset``
fixture (``Dataset.truth``) and never import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tests.conftest import Dataset

OBS_FIELDS = ("perturbation", "cell_type", "batch", "donor")  # of stage="shards"
N_PERTS = 12  # perturbation code 0 is the control
SENTENCE_LEN = 4
COND_DIM = 8
OBSM_KEY = "pca"
OBSM_DIM = 5
CONDITIONS_FILE = "conditions.zarr"


class Truth:
    """What stage="shards" wrote, by sample_id (duplicated controls share their original's id)."""

    def __init__(self, ds: Dataset) -> None:
        from loaders.format import COND_ID, OBS_PREFIX, OBSM_PREFIX

        table = ds.by_sample()
        self.dense, self.pca = table["X"], table[OBSM_PREFIX + OBSM_KEY]
        self.cond_id = table[COND_ID].astype(np.int64)
        self.obs = {f: table[OBS_PREFIX + f].astype(np.int64) for f in OBS_FIELDS}
        self.vectors = ds.vectors


def _random_csr(
    rng: np.random.Generator, n: int, n_genes: int, density: float
) -> tuple[np.ndarray, ...]:
    """Canonical CSR (sorted, unique columns), ~``density`` of it set, a block of rows a time."""
    cols, lens = [], []
    for lo in range(0, n, 2048):
        mask = rng.random((min(n, lo + 2048) - lo, n_genes)) < density
        lens.append(mask.sum(axis=1))
        cols.append(np.nonzero(mask)[1])
    lens_a = np.concatenate(lens + [np.zeros(0, np.int64)])
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(lens_a, out=indptr[1:])
    col_a = np.concatenate(cols + [np.zeros(0, np.int64)]).astype(np.int32)
    vals = (rng.poisson(1.5, size=col_a.size) + 1).astype(np.float32)
    return indptr, col_a, vals


def _take_rows(
    indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, ...]:
    lens = indptr[rows + 1] - indptr[rows]
    new_ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    flat = np.repeat(indptr[rows] - new_ptr[:-1], lens) + np.arange(int(new_ptr[-1]))
    return new_ptr, cols[flat], vals[flat]


def write_shards(
    root: Path,
    n_shards: int,
    cells: int,
    n_genes: int,
    seed: int,
    splits: Sequence[str],
    density: float,
    n_dup_controls: int,
    codec: str,
) -> dict[str, Any]:
    """Shard ``i`` (of split ``splits[i % len(splits)]``) holds ``cells`` primary cells and a few
    control cells duplicated from shard ``i - 1`` (``primary=False``), pairs and sentences of its
    own rows; then a condition table and an ``index.json``, as a build writes them. Returns
    ``Dataset``'s stage="shards" fields: the columns as written, in index order."""
    from loaders import format as fm
    from pipeline.writers import Codec, get_writer

    tables = (fm.PAIRS, fm.SENTENCES_PERT, fm.SENTENCES_CTRL)
    rng = np.random.default_rng(seed)
    (root / fm.SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    writer = get_writer("zarr", Codec(codec))
    shard_splits = [splits[i % len(splits)] for i in range(n_shards)]

    # primary cells first, so duplicated controls can copy rows of other shards
    primaries = []
    next_id = 0
    for i in range(n_shards):
        n = cells
        indptr, cols, vals = _random_csr(rng, n, n_genes, density)
        pert = np.where(rng.random(n) < 0.25, 0, rng.integers(1, N_PERTS + 1, size=n))
        pert = pert.astype(np.int32)
        pert[0] = 0  # every shard has a control for its pairs and sentences to refer to
        obs = {
            "perturbation": pert,
            "cell_type": rng.integers(0, 3, size=n).astype(np.int32),
            "batch": np.full(n, i % 4, np.int32),  # one plate per shard, like a real plan
            "donor": rng.integers(0, 5, size=n).astype(np.int32),
        }
        primaries.append(
            {
                "indptr": indptr,
                "cols": cols,
                "vals": vals,
                "obs": obs,
                "sample_id": np.arange(next_id, next_id + n, dtype=np.int64),
                "pca": rng.standard_normal((n, OBSM_DIM)).astype(np.float32),
            }
        )
        next_id += n

    shards, entries = [], []
    for i, p in enumerate(primaries):
        # duplicate a few control cells of the previous shard into this one (non-primary rows)
        src = primaries[(i - 1) % n_shards]
        ctrl_rows = np.flatnonzero(src["obs"]["perturbation"] == 0)
        dup = (
            rng.choice(ctrl_rows, size=min(n_dup_controls, ctrl_rows.size), replace=False)
            if n_shards > 1
            else []
        )
        dup = np.sort(np.asarray(dup, dtype=np.int64))
        d_ptr, d_cols, d_vals = _take_rows(src["indptr"], src["cols"], src["vals"], dup)
        n_prim, n_all = p["sample_id"].size, p["sample_id"].size + dup.size
        obs = {
            k: np.concatenate([v, src["obs"][k][dup]]).astype(np.int32) for k, v in p["obs"].items()
        }
        cols_map = {
            fm.X + "/indptr": np.concatenate([p["indptr"], p["indptr"][-1] + d_ptr[1:]]),
            fm.X + "/indices": np.concatenate([p["cols"], d_cols]),
            fm.X + "/data": np.concatenate([p["vals"], d_vals]),
            fm.SAMPLE_ID: np.concatenate([p["sample_id"], src["sample_id"][dup]]),
            fm.PRIMARY: np.arange(n_all) < n_prim,
            fm.COND_ID: obs["perturbation"].copy(),
            fm.OBSM_PREFIX + OBSM_KEY: np.concatenate([p["pca"], src["pca"][dup]]),
            **{fm.OBS_PREFIX + k: v for k, v in obs.items()},
        }
        pert = obs["perturbation"]
        controls = np.flatnonzero(pert == 0)
        perturbed = np.flatnonzero((pert != 0) & cols_map[fm.PRIMARY])
        pairs = np.stack([rng.choice(controls, size=perturbed.size), perturbed], axis=1)
        cols_map[fm.PAIRS] = pairs.astype(np.int32)
        sent_p = []
        for code in np.unique(pert[perturbed]):
            group = rng.permutation(perturbed[pert[perturbed] == code])
            k = group.size // SENTENCE_LEN
            sent_p.extend(group[: k * SENTENCE_LEN].reshape(k, SENTENCE_LEN))
        sent_p = np.asarray(sent_p, np.int32).reshape(-1, SENTENCE_LEN)
        cols_map[fm.SENTENCES_PERT] = sent_p
        cols_map[fm.SENTENCES_CTRL] = rng.choice(controls, size=sent_p.shape).astype(np.int32)
        name = f"shard-{i:05d}.zarr"
        path = root / fm.SHARDS_DIR / name
        writer.write(path, cols_map, tables)
        shards.append(cols_map)
        units = {
            "cells": n_prim,
            "pairs": int(cols_map[fm.PAIRS].shape[0]),
            "sentences": int(sent_p.shape[0]),
        }
        entries.append(
            fm.ShardEntry(
                file=name,
                split=shard_splits[i],
                records=n_all,
                units=units,
                bytes=fm.stored_bytes(path),
                raw_bytes=sum(a.nbytes for a in cols_map.values()),
                digest=fm.content_hash(path),
                plan_key=f"fixture/{i}",
                source=0,
            )
        )

    vectors = rng.standard_normal((N_PERTS + 1, COND_DIM)).astype(np.float32)
    writer.write(root / CONDITIONS_FILE, {"vectors": vectors})
    fields = [
        fm.FieldSpec(fm.X, "csr", "float32", (n_genes,)),
        fm.FieldSpec(fm.SAMPLE_ID, "dense", "int64"),
        fm.FieldSpec(fm.PRIMARY, "dense", "bool"),
        fm.FieldSpec(fm.COND_ID, "dense", "int32"),
        *[fm.FieldSpec(fm.OBS_PREFIX + k, "dense", "int32") for k in OBS_FIELDS],
        fm.FieldSpec(fm.OBSM_PREFIX + OBSM_KEY, "dense", "float32", (OBSM_DIM,)),
    ]
    vocab = {
        "perturbation": ["control"] + [f"GENE{i}" for i in range(1, N_PERTS + 1)],
        "cell_type": ["T", "B", "NK"],
        "batch": [f"plate{i}" for i in range(4)],
        "donor": [f"d{i}" for i in range(5)],
    }
    conditions = fm.ConditionsRef(file=CONDITIONS_FILE, rows=N_PERTS + 1, dim=COND_DIM)
    fm.write_index(
        fm.Index(
            root=root,
            name="fixture",
            kind="perturbation",
            encoding="zarr",
            fields=fields,
            tables=list(tables),
            shards=entries,
            samples=["cells", "pairs", "sentences"],
            vocabularies=vocab,
            obs_fields=list(OBS_FIELDS),
            conditions=conditions,
        )
    )
    return dict(n_genes=n_genes, shards=shards, splits=shard_splits, vectors=vectors)
