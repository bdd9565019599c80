"""Condition vectors: one row per distinct (perturbation, cell type, batch, covariates) combination.

Stored once per dataset; every cell carries only its `cond_id`. The vector is the concatenation of one-hot
blocks per field, or, for the perturbation block, a feature vector from a user table (npz/csv/npy: never pickle).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import ManifestError
from pipeline.plan.pairing import combine


@dataclass
class ConditionTable:
    cond_id: np.ndarray  # int32 [n_cells]
    codes: np.ndarray  # int32 [C, F]
    vectors: np.ndarray  # float32 [C, D]
    segments: list[dict[str, object]]  # field, offset, size, encoding


def load_features(path: Path, names: Sequence[str], controls: Sequence[str]) -> np.ndarray:
    """Feature rows for each perturbation name; controls missing from the table get zeros."""
    table: dict[str, np.ndarray] = {}
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            table = {k: np.asarray(z[k], np.float32).ravel() for k in z.files}
    elif path.suffix == ".csv":
        with open(path, newline="") as fh:
            for row in csv.reader(fh):
                if row and not row[0].startswith("#"):
                    try:
                        table[row[0]] = np.asarray([float(v) for v in row[1:]], np.float32)
                    except ValueError:
                        if table:  # only a first (header) row may be non-numeric
                            raise ManifestError(path, "perturbation_features", f"non-numeric row {row[0]!r}") from None
    else:  # .npy: rows in the order of the sorted perturbation vocabulary
        arr = np.load(path, allow_pickle=False)
        if arr.ndim != 2 or arr.shape[0] != len(names):
            raise ManifestError(path, "perturbation_features", f"npy needs shape [{len(names)}, d], got {arr.shape}")
        return arr.astype(np.float32)
    dims = {v.size for v in table.values()}
    if len(dims) != 1:
        raise ManifestError(path, "perturbation_features", f"rows have different lengths {sorted(dims)}")
    dim = dims.pop()
    missing = [n for n in names if n not in table and n not in controls]
    if missing:
        raise ManifestError(path, "perturbation_features", f"no features for perturbations {missing[:5]}")
    return np.stack([table.get(n, np.zeros(dim, np.float32)) for n in names]).astype(np.float32)


def build_conditions(codes: Mapping[str, np.ndarray], fields: Sequence[str], vocab: Mapping[str, list[str]],
                     features: np.ndarray | None = None) -> ConditionTable:
    keys = np.stack([codes[f] for f in fields], axis=1).astype(np.int32)
    packed = combine(*(keys[:, j] for j in range(keys.shape[1])))  # 1-D unique: far faster than axis=0
    _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    table = keys[first]
    blocks: list[np.ndarray] = []
    segments: list[dict[str, object]] = []
    offset = 0
    for j, f in enumerate(fields):
        if f == "perturbation" and features is not None:
            block = features[table[:, j]]
            enc = "features"
        else:
            block = np.zeros((table.shape[0], len(vocab[f])), np.float32)
            block[np.arange(table.shape[0]), table[:, j]] = 1.0
            enc = "onehot"
        blocks.append(block)
        segments.append({"field": f, "offset": offset, "size": int(block.shape[1]), "encoding": enc})
        offset += block.shape[1]
    vectors = np.concatenate(blocks, axis=1).astype(np.float32) if blocks else np.zeros((1, 0), np.float32)
    return ConditionTable(inverse.ravel().astype(np.int32), table, vectors, segments)
