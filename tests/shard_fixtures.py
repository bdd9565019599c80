"""Small but realistic perturbation datasets on disk, written through the real shard writer.

Until the pipeline's ``build`` lands, loader tests need datasets that look like its output: CSR
counts, primary cells plus control cells duplicated from other shards (``primary=False``), pairs
and sentences referring to local rows, a condition table and an ``index.json``. The in-memory
columns are returned too so tests can compare what the loader yields with what was written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loaders.format import (
    COND_ID,
    OBS_PREFIX,
    OBSM_PREFIX,
    PAIRS,
    PRIMARY,
    SAMPLE_ID,
    SENTENCES_CTRL,
    SENTENCES_PERT,
    SHARDS_DIR,
    ConditionsRef,
    FieldSpec,
    Index,
    ShardEntry,
    X,
    content_hash,
    stored_bytes,
    write_index,
)
from pipeline.writers import Codec, get_writer

TABLES = (PAIRS, SENTENCES_PERT, SENTENCES_CTRL)

OBS_FIELDS = ("perturbation", "cell_type", "batch", "donor")
N_PERTS = 12  # perturbation code 0 is the control
SENTENCE_LEN = 4
COND_DIM = 8
OBSM_KEY = "pca"
OBSM_DIM = 5
CONDITIONS_FILE = "conditions.zarr"


@dataclass
class Fixture:
    root: Path
    n_genes: int
    shards: list[dict[str, np.ndarray]]  # columns as written, in index order
    splits: list[str]
    vectors: np.ndarray  # condition table [C, D]
    _by_sample: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def primary_ids(self, split: str) -> np.ndarray:
        return np.concatenate([s[SAMPLE_ID][s[PRIMARY]] for s, sp in zip(self.shards, self.splits, strict=True) if sp == split]
                              + [np.zeros(0, np.int64)])

    def by_sample(self) -> dict[str, np.ndarray]:
        """Everything written, indexed by sample_id: "X" dense [n_ids, G], "cond_id", "obs/*", "obsm/*".

        A duplicated control shares its original's sample_id and content, so the table is well defined.
        """
        if not self._by_sample:
            n_ids = 1 + max(int(s[SAMPLE_ID].max()) for s in self.shards)
            table = {"X": np.zeros((n_ids, self.n_genes), np.float32)}
            for s in self.shards:
                ids = s[SAMPLE_ID]
                ptr = s[X + "/indptr"]
                table["X"][ids[np.repeat(np.arange(ptr.size - 1), np.diff(ptr))], s[X + "/indices"]] = s[X + "/data"]
                for k in [COND_ID, OBSM_PREFIX + OBSM_KEY, *(OBS_PREFIX + f for f in OBS_FIELDS)]:
                    table.setdefault(k, np.zeros((n_ids, *s[k].shape[1:]), s[k].dtype))[ids] = s[k]
            self._by_sample.update(table)
        return self._by_sample


def _random_csr(rng: np.random.Generator, n: int, n_genes: int, density: float) -> tuple[np.ndarray, ...]:
    """Canonical CSR (sorted, unique columns) with ~``density`` of entries set, built a block of rows at a time."""
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


def _take_rows(indptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    lens = indptr[rows + 1] - indptr[rows]
    new_ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=new_ptr[1:])
    flat = np.repeat(indptr[rows] - new_ptr[:-1], lens) + np.arange(int(new_ptr[-1]))
    return new_ptr, cols[flat], vals[flat]


def make_dataset(root: str | Path, n_shards: int = 6, cells_per_shard: int = 200, n_genes: int = 50, seed: int = 0,
                 splits: Sequence[str] = ("train",), density: float = 0.1, n_dup_controls: int = 6,
                 codec: str = "blosc-lz4") -> Fixture:
    """Write a dataset of ``n_shards`` shards; shard ``i`` belongs to ``splits[i % len(splits)]``."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    writer = get_writer("zarr", Codec(codec))
    shard_splits = [splits[i % len(splits)] for i in range(n_shards)]

    # primary cells first, so duplicated controls can copy rows of other shards
    primaries = []
    next_id = 0
    for i in range(n_shards):
        n = cells_per_shard
        indptr, cols, vals = _random_csr(rng, n, n_genes, density)
        pert = np.where(rng.random(n) < 0.25, 0, rng.integers(1, N_PERTS + 1, size=n)).astype(np.int32)
        pert[0] = 0  # every shard has a control for its pairs and sentences to refer to
        obs = {
            "perturbation": pert,
            "cell_type": rng.integers(0, 3, size=n).astype(np.int32),
            "batch": np.full(n, i % 4, np.int32),  # one plate per shard, like a real plan
            "donor": rng.integers(0, 5, size=n).astype(np.int32),
        }
        primaries.append({"indptr": indptr, "cols": cols, "vals": vals, "obs": obs,
                          "sample_id": np.arange(next_id, next_id + n, dtype=np.int64),
                          "pca": rng.standard_normal((n, OBSM_DIM)).astype(np.float32)})
        next_id += n

    shards, entries = [], []
    for i, p in enumerate(primaries):
        # duplicate a few control cells of the previous shard into this one (non-primary rows)
        src = primaries[(i - 1) % n_shards]
        ctrl_rows = np.flatnonzero(src["obs"]["perturbation"] == 0)
        dup = rng.choice(ctrl_rows, size=min(n_dup_controls, ctrl_rows.size), replace=False) if n_shards > 1 else []
        dup = np.sort(np.asarray(dup, dtype=np.int64))
        d_ptr, d_cols, d_vals = _take_rows(src["indptr"], src["cols"], src["vals"], dup)
        indptr = np.concatenate([p["indptr"], p["indptr"][-1] + d_ptr[1:]])
        cols = np.concatenate([p["cols"], d_cols])
        vals = np.concatenate([p["vals"], d_vals])
        n_prim, n_all = p["sample_id"].size, p["sample_id"].size + dup.size
        obs = {k: np.concatenate([v, src["obs"][k][dup]]).astype(np.int32) for k, v in p["obs"].items()}
        cols_map = {
            X + "/indptr": indptr, X + "/indices": cols, X + "/data": vals,
            SAMPLE_ID: np.concatenate([p["sample_id"], src["sample_id"][dup]]),
            PRIMARY: np.arange(n_all) < n_prim,
            COND_ID: obs["perturbation"].copy(),
            OBSM_PREFIX + OBSM_KEY: np.concatenate([p["pca"], src["pca"][dup]]),
            **{OBS_PREFIX + k: v for k, v in obs.items()},
        }
        pert = obs["perturbation"]
        controls = np.flatnonzero(pert == 0)
        perturbed = np.flatnonzero((pert != 0) & cols_map[PRIMARY])
        cols_map[PAIRS] = np.stack([rng.choice(controls, size=perturbed.size), perturbed], axis=1).astype(np.int32)
        sent_p = []
        for code in np.unique(pert[perturbed]):
            group = rng.permutation(perturbed[pert[perturbed] == code])
            k = group.size // SENTENCE_LEN
            sent_p.extend(group[: k * SENTENCE_LEN].reshape(k, SENTENCE_LEN))
        sent_p = np.asarray(sent_p, np.int32).reshape(-1, SENTENCE_LEN)
        cols_map[SENTENCES_PERT] = sent_p
        cols_map[SENTENCES_CTRL] = rng.choice(controls, size=sent_p.shape).astype(np.int32)
        name = f"shard-{i:05d}.zarr"
        writer.write(root / SHARDS_DIR / name, cols_map, TABLES)
        shards.append(cols_map)
        path = root / SHARDS_DIR / name
        entries.append(ShardEntry(file=name, split=shard_splits[i], records=n_all,
                                  units={"cells": n_prim, "pairs": int(cols_map[PAIRS].shape[0]),
                                         "sentences": int(sent_p.shape[0])},
                                  bytes=stored_bytes(path), raw_bytes=sum(a.nbytes for a in cols_map.values()),
                                  sha256=content_hash(path), plan_key=f"fixture/{i}", source=0))

    vectors = rng.standard_normal((N_PERTS + 1, COND_DIM)).astype(np.float32)
    writer.write(root / CONDITIONS_FILE, {"vectors": vectors})
    fields = [FieldSpec(X, "csr", "float32", (n_genes,)), FieldSpec(SAMPLE_ID, "dense", "int64"),
              FieldSpec(PRIMARY, "dense", "bool"), FieldSpec(COND_ID, "dense", "int32"),
              *[FieldSpec(OBS_PREFIX + k, "dense", "int32") for k in OBS_FIELDS],
              FieldSpec(OBSM_PREFIX + OBSM_KEY, "dense", "float32", (OBSM_DIM,))]
    vocab = {"perturbation": ["control"] + [f"GENE{i}" for i in range(1, N_PERTS + 1)],
             "cell_type": ["T", "B", "NK"], "batch": [f"plate{i}" for i in range(4)],
             "donor": [f"d{i}" for i in range(5)]}
    write_index(Index(root=root, name="fixture", kind="perturbation", encoding="zarr", fields=fields,
                      tables=list(TABLES), shards=entries, samples=["cells", "pairs", "sentences"],
                      vocabularies=vocab, obs_fields=list(OBS_FIELDS),
                      conditions=ConditionsRef(file=CONDITIONS_FILE, rows=N_PERTS + 1, dim=COND_DIM)))
    return Fixture(root=root, n_genes=n_genes, shards=shards, splits=shard_splits, vectors=vectors)


def transported(payload: Any, output: str) -> list[dict[str, Any]]:
    """One payload through every transport: main-process tensors, a worker's fresh shared segment, and a
    worker's ring slot that held an earlier item's bytes (0x7F everywhere: finishers must not assume zeros),
    shipped as the second batch of a run of two."""
    from loaders.collate import to_shared, to_tensors
    from loaders.device import unpack_batches
    from loaders.engine.ring import Ring

    ring = Ring(1, max_bytes=64 << 20)
    stale = to_shared([payload, payload], output, ring)
    assert stale.slot is not None
    stale.buffer.numpy()[:] = 0x7F
    ring.control[stale.slot[1]] = 0  # the consumer let it go
    del stale
    item = to_shared([payload, payload], output, ring)
    assert item.slot is not None, "the ring must have served this item"
    return [to_tensors(payload, output), unpack_batches(to_shared([payload], output))[0],
            unpack_batches(item)[1]]
