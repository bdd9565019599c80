"""Split assignment: random holdout, zero-shot (cell types held out), few-shot (perturbations held
out per cell type), or a cell-load experiment file
(pipeline/modalities/perturbation/cellload.py). Decisions about named groups use a stable hash of
(seed, names) so that adding a source does not reshuffle the splits of the others; per-cell draws
come from a per-source generator for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from pipeline.errors import ManifestError
from pipeline.manifest import Manifest
from pipeline.modalities.perturbation.cellload import assign_cellload
from pipeline.modalities.perturbation.cells import CellTable
from pipeline.modalities.perturbation.conditions import split_combinations
from pipeline.modalities.perturbation.split_codes import (  # noqa: F401  (re-exported)
    DROPPED,
    SPLIT_NAMES,
    TEST,
    TRAIN,
    VAL,
    _by_fraction,
)
from pipeline.modalities.perturbation.split_config import FewshotEntry
from pipeline.seeding import source_rng, stable_unit


def _random_per_cell(cells: CellTable, seed: int, val: float, test: float) -> np.ndarray:
    u = np.empty(len(cells))
    for s in np.unique(cells.source):
        m = cells.source == s
        u[m] = source_rng(seed, int(s), 1).random(int(m.sum()))
    return _by_fraction(u, val, test)


def held_out_cell_types(names: Sequence[str], manifest: Manifest) -> dict[str, int]:
    sp = manifest.config.split
    if sp.val_cell_types is not None or sp.test_cell_types is not None:
        out = {
            **{c: VAL for c in sp.val_cell_types or ()},
            **{c: TEST for c in sp.test_cell_types or ()},
        }
        unknown = sorted(set(out) - set(names))
        if unknown:
            key = (
                "split.test_cell_types"
                if unknown[0] in (sp.test_cell_types or ())
                else "split.val_cell_types"
            )
            raise ManifestError(
                manifest.path,
                key,
                f"held-out cell types {unknown} not in the data; the cell types "
                f"are {list(names)[:20]} (obs column fields.cell_type)",
            )
        if not out or len(out) == len(names):
            raise ManifestError(
                manifest.path,
                "split.val_cell_types/test_cell_types",
                f"hold out {len(out)} of the {len(names)} cell types {list(names)}: list at least "
                "one, and leave at least one for train",
            )
        return out
    ranked = sorted(names, key=lambda n: stable_unit(manifest.seed, "zeroshot", n))
    n = len(ranked)
    n_test = min(n - 1, max(1 if sp.test_fraction > 0 else 0, round(sp.test_fraction * n)))
    n_val = min(n - 1 - n_test, max(1 if sp.val_fraction > 0 else 0, round(sp.val_fraction * n)))
    if n < 2 or n_test + n_val == 0:
        raise ManifestError(
            manifest.path,
            "split.mode",
            f"zeroshot needs at least 2 cell types, the data has {n} "
            f'({list(names)[:5]}): check fields.cell_type, or use mode = "fewshot"',
        )
    if sp.val_fraction > 0 and n_val == 0:  # asked for a val split that would silently be empty
        raise ManifestError(
            manifest.path,
            "split.val_fraction",
            f"zeroshot over {n} cell types {list(names)} holds {n_test} out for test and keeps one "
            "for train: none is left for val; set val_fraction = 0 or name split.val_cell_types",
        )
    return {
        **{c: TEST for c in ranked[:n_test]},
        **{c: VAL for c in ranked[n_test : n_test + n_val]},
    }


def _combo_table(cells: CellTable) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """Distinct (cell type, perturbation) codes of the cells: (uniq combos, inverse, ct names, pert
    names)."""
    ct_codes, ct_names = cells.cell_types()
    perts = cells.vocabularies["perturbation"]
    combo = ct_codes.astype(np.int64) * len(perts) + cells.codes["perturbation"]
    uniq, inv = np.unique(combo, return_inverse=True)
    return uniq, inv.ravel(), ct_names, perts


def seen_gene_combinations(
    names: Sequence[str], present: set[str], separator: str, controls: Sequence[str]
) -> set[str]:
    """Labels that are combinations (2+ parts) whose every part is itself a single-perturbation
    label present in the same cell type: GEARS' "unseen combination of seen genes" candidates."""

    singles, parts = split_combinations(names, separator, controls)
    return {
        n
        for n, ps in zip(names, parts, strict=True)
        if len(ps) >= 2 and all(singles[p] in present for p in ps)
    }


def fewshot_per_combo(
    cells: CellTable,
    manifest: Manifest,
    entries: Mapping[str, FewshotEntry] | None,
    seed_tag: str = "fewshot",
) -> np.ndarray:
    """The split of each perturbed cell under few-shot rules, decided once per (cell type,
    perturbation).

    Without entries every pair is hashed by the global fractions (the original rule). With
    entries only the listed cell types leave train: listed perturbations first (test wins over
    val), then each other perturbation by the entry's fractions. `combinations = "seen_genes"`
    keeps single perturbations and combinations of unseen parts in train (unless listed by name),
    so every drawn held-out label is a combination of genes seen alone."""
    sp, fields = manifest.config.split, manifest.config.fields
    uniq, inv, ct_names, perts = _combo_table(cells)
    eligible: set[tuple[str, str]] | None = None
    if sp.combinations == "seen_genes":
        assert fields.combination_separator is not None
        eligible = set()
        for c in np.unique(uniq // len(perts)).tolist():
            present = {perts[q % len(perts)] for q in uniq.tolist() if q // len(perts) == c}
            seen = seen_gene_combinations(
                sorted(present), present, fields.combination_separator, fields.control
            )
            eligible |= {(ct_names[c], n) for n in seen}
    out = np.zeros(uniq.size, np.int8)
    for i, q in enumerate(uniq.tolist()):
        ct, pert = ct_names[q // len(perts)], perts[q % len(perts)]
        val, test = sp.val_fraction, sp.test_fraction
        if entries is not None:
            if ct not in entries:
                continue
            e = entries[ct]
            if pert in e.test or pert in e.val:  # named explicitly: wins over the combinations rule
                out[i] = TEST if pert in e.test else VAL
                continue
            val, test = e.val_fraction, e.test_fraction
        if eligible is not None and (ct, pert) not in eligible:
            continue
        out[i] = _by_fraction(
            np.array([stable_unit(manifest.seed, seed_tag, ct, pert)]), val, test
        )[0]
    return out[inv]


def assign_splits(cells: CellTable, manifest: Manifest, paths: Sequence[Path] = ()) -> np.ndarray:
    """Each cell's split: TRAIN, VAL, TEST, or DROPPED (a cell a cell-load experiment does not use).
    `paths` are the sources' files by ordinal (a cell-load experiment maps them to its datasets)."""
    sp = manifest.config.split
    if sp.experiment is not None:
        return assign_cellload(cells, manifest, sp.experiment, paths)
    if sp.mode == "random":
        return _random_per_cell(cells, manifest.seed, sp.val_fraction, sp.test_fraction)
    if sp.mode == "zeroshot":
        ct_codes, ct_names = cells.cell_types()
        held = held_out_cell_types(ct_names, manifest)
        per_type = np.array([held.get(c, TRAIN) for c in ct_names], np.int8)
        split = per_type[ct_codes]
    else:  # fewshot: each (cell type, perturbation) combination goes to one split
        split = fewshot_per_combo(cells, manifest, sp.fewshot)
        if sp.controls == "heldout":  # controls are split per cell
            ctrl_split = _random_per_cell(cells, manifest.seed, sp.val_fraction, sp.test_fraction)
            return np.where(cells.is_control, ctrl_split, split).astype(np.int8)
    if sp.controls == "train":
        split = np.where(cells.is_control, TRAIN, split).astype(np.int8)
    return split


def control_split(manifest: Manifest, split: np.ndarray) -> np.ndarray | None:
    """The split whose controls each cell's pairs and sentences draw from, where it differs from its
    own: with controls kept in train (cell-load), val/test cells are matched to train's controls
    of their cell type and batch, which their shards then store as non-primary copies."""
    if manifest.config.split.controls != "train":
        return None
    return np.zeros_like(split)
