"""Split assignment: random holdout, zero-shot (cell types held out), few-shot (perturbations held out per
cell type). Decisions about named groups use a stable hash of (seed, names) so that adding a source does
not reshuffle the splits of the others; per-cell draws come from a per-source generator for the same reason.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from pipeline.errors import ManifestError
from pipeline.manifest import Manifest
from pipeline.plan.cells import CellTable

TRAIN, VAL, TEST = 0, 1, 2
SPLIT_NAMES = ("train", "val", "test")


def stable_unit(seed: int, *names: str) -> float:
    """A uniform number in [0, 1) that depends only on the seed and the names."""
    h = hashlib.blake2b("\x1f".join((str(seed), *names)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64


def source_rng(seed: int, source: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([seed, source, purpose])


def _by_fraction(u: np.ndarray, val: float, test: float) -> np.ndarray:
    return np.where(u < test, TEST, np.where(u < test + val, VAL, TRAIN)).astype(np.int8)


def _random_per_cell(cells: CellTable, seed: int, val: float, test: float) -> np.ndarray:
    u = np.empty(len(cells))
    for s in np.unique(cells.source):
        m = cells.source == s
        u[m] = source_rng(seed, int(s), 1).random(int(m.sum()))
    return _by_fraction(u, val, test)


def held_out_cell_types(names: Sequence[str], manifest: Manifest) -> dict[str, int]:
    sp = manifest.config.split
    if sp.val_cell_types is not None or sp.test_cell_types is not None:
        out = {**{c: VAL for c in sp.val_cell_types or ()}, **{c: TEST for c in sp.test_cell_types or ()}}
        unknown = sorted(set(out) - set(names))
        if unknown:
            raise ManifestError(manifest.path, "split", f"held-out cell types {unknown} not in data ({list(names)})")
        if not out or len(out) == len(names):
            raise ManifestError(manifest.path, "split.val_cell_types/test_cell_types",
                                f"hold out {len(out)} of the {len(names)} cell types {list(names)}: list at least "
                                "one, and leave at least one for train")
        return out
    ranked = sorted(names, key=lambda n: stable_unit(manifest.seed, "zeroshot", n))
    n = len(ranked)
    n_test = min(n - 1, max(1 if sp.test_fraction > 0 else 0, round(sp.test_fraction * n)))
    n_val = min(n - 1 - n_test, max(1 if sp.val_fraction > 0 else 0, round(sp.val_fraction * n)))
    if n < 2 or n_test + n_val == 0:
        raise ManifestError(manifest.path, "split.mode", f"zeroshot needs at least 2 cell types, data has {n}")
    if sp.val_fraction > 0 and n_val == 0:  # asked for a val split that would silently be empty
        raise ManifestError(manifest.path, "split.val_fraction",
                            f"zeroshot over {n} cell types {list(names)} holds {n_test} out for test and keeps one "
                            "for train: none is left for val; set val_fraction = 0 or name split.val_cell_types")
    return {**{c: TEST for c in ranked[:n_test]}, **{c: VAL for c in ranked[n_test:n_test + n_val]}}


def assign_splits(cells: CellTable, manifest: Manifest) -> np.ndarray:
    sp = manifest.config.split
    if sp.mode == "random":
        return _random_per_cell(cells, manifest.seed, sp.val_fraction, sp.test_fraction)
    ct_names = cells.vocabularies["cell_type"]
    if sp.mode == "zeroshot":
        held = held_out_cell_types(ct_names, manifest)
        per_type = np.array([held.get(c, TRAIN) for c in ct_names], np.int8)
        return per_type[cells.codes["cell_type"]]
    # fewshot: each (cell type, perturbation) combination goes to one split; controls are split per cell
    perts = cells.vocabularies["perturbation"]
    combo = cells.codes["cell_type"].astype(np.int64) * len(perts) + cells.codes["perturbation"]
    uniq, inv = np.unique(combo, return_inverse=True)
    u = np.array([stable_unit(manifest.seed, "fewshot", ct_names[c // len(perts)], perts[c % len(perts)])
                  for c in uniq.tolist()])
    split = _by_fraction(u, sp.val_fraction, sp.test_fraction)[inv.ravel()]
    ctrl_split = _random_per_cell(cells, manifest.seed, sp.val_fraction, sp.test_fraction)
    return np.where(cells.is_control, ctrl_split, split).astype(np.int8)
