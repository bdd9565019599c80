"""Splits from a cell-load experiment TOML (ArcInstitute/cell-load, as STATE uses it), cell by cell.

cell-load's rules (``PerturbationDataModule._setup_datasets`` / ``_process_celltype``), per
dataset, file and cell type:

* ``[zeroshot] "dataset.celltype" = "val"|"test"``: the cell type's perturbed cells go to that
split; its
  control cells stay in **train** (cell-load adds them to train as observational data) and also
  serve as
  the held-out cells' controls (here: pairs/sentences in val/test draw them from train; the val/test
  shards
  store them as non-primary copies). ``= "train"`` keeps the whole cell type in train.
* ``[fewshot."dataset.celltype"] val = [...], test = [...]``: listed perturbations go to val/test,
all others
  to train; controls stay in train and serve every split, as above. A perturbation in both lists
  goes to
  test (cell-load yields it in both; a shard holds each cell once). shardsmith also accepts
  ``val_fraction``/``test_fraction`` in such a table: each unlisted perturbation is drawn by a
  stable hash of
  (seed, dataset, cell type, perturbation).
* otherwise, a dataset with ``[training] name = "train"``: every cell in train;
* otherwise the cell is not used by the experiment: dropped and counted (``stats.dropped``).

``[datasets]`` paths name folders of ``.h5``/``.h5ad`` files (or a file, or a glob), relative to
the experiment file. A manifest source belongs to the dataset whose path resolves to it; when the
paths are another machine's, to the dataset whose path ends in the source's folder name or file
stem, or whose name is that folder name or stem.
"""

from __future__ import annotations

import glob
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.errors import ManifestError
from pipeline.manifest import Manifest
from pipeline.modalities.perturbation.cells import CellTable
from pipeline.modalities.perturbation.split_codes import (
    DROPPED,
    SPLIT_NAMES,
    TEST,
    TRAIN,
    VAL,
    _by_fraction,
)
from pipeline.modalities.perturbation.split_config import Experiment
from pipeline.seeding import stable_unit

log = logging.getLogger(__name__)


def dataset_files(exp: Experiment, name: str) -> set[Path]:
    """The files a ``[datasets]`` entry names, as cell-load finds them (folder: ``*.h5`` and
    ``*.h5ad``)."""
    raw = exp.datasets[name]
    base = Path(raw) if Path(raw).is_absolute() else exp.path.parent / raw
    if any(ch in raw for ch in "*?[]"):
        hits = [Path(p) for p in glob.glob(str(base))]
        if not raw.endswith((".h5", ".h5ad")):
            hits = [
                Path(p) for h in hits for ext in ("*.h5", "*.h5ad") for p in glob.glob(str(h / ext))
            ]
        return {p.resolve() for p in hits}
    if base.is_file():
        return {base.resolve()}
    if base.is_dir():
        return {p.resolve() for ext in ("*.h5", "*.h5ad") for p in base.glob(ext)}
    return set()


def source_datasets(exp: Experiment, paths: Sequence[Path]) -> list[str]:
    """The experiment's dataset name of each source (see the module docstring for the rules)."""
    files = {name: dataset_files(exp, name) for name in exp.datasets}
    out = []
    for path in paths:
        p = Path(path).resolve()
        hits = [n for n, fs in files.items() if p in fs]
        if not hits:
            names = {p.stem, p.parent.name}
            hits = [
                n for n, raw in exp.datasets.items() if Path(raw.rstrip("/")).stem in names
            ] or [n for n in exp.datasets if n in names]
        if len(hits) != 1:
            problem = "matches no dataset" if not hits else f"matches several datasets {hits}"
            raise ManifestError(
                exp.path,
                "datasets",
                f"source {p} {problem}: name its folder or file in [datasets] "
                f'(e.g. {p.parent.name} = "{p.parent}/"), or name the dataset after its folder',
            )
        out.append(hits[0])
    ours = {Path(p).resolve() for p in paths}
    for name in sorted(exp.used()):
        extra = sorted(str(f) for f in files.get(name, set()) - ours)
        if extra:  # cell-load would train on these too: the split here covers fewer cells than it
            log.warning(
                "%s: dataset %r also holds %d file(s) the manifest does not list as sources (%s): "
                "add them to [[sources]] to reproduce cell-load's assignment",
                exp.path,
                name,
                len(extra),
                ", ".join(extra[:3]),
            )
    return out


def assign_cellload(
    cells: CellTable, manifest: Manifest, exp: Experiment, paths: Sequence[Path]
) -> np.ndarray:
    """Each cell's split under the experiment's rules (TRAIN, VAL, TEST or DROPPED)."""
    ds_of_source = source_datasets(exp, paths)
    ct_codes, ct_names = cells.cell_types()
    perts = cells.vocabularies["perturbation"]
    n_ct, n_p = len(ct_names), len(perts)
    key = (cells.source.astype(np.int64) * n_ct + ct_codes) * n_p + cells.codes["perturbation"]
    uniq, inv = np.unique(key, return_inverse=True)
    split_of = np.zeros(uniq.size, np.int8)
    seen_groups: set[str] = set()
    for i, q in enumerate(uniq.tolist()):
        s, rest = divmod(q, n_ct * n_p)
        c, pc = divmod(rest, n_p)
        ds, ct, pert = ds_of_source[s], ct_names[c], perts[pc]
        group = f"{ds}.{ct}"
        seen_groups.add(group)
        is_ctrl = pert in manifest.config.fields.control
        if group in exp.zeroshot:
            split_of[i] = TRAIN if is_ctrl else SPLIT_NAMES.index(exp.zeroshot[group])
        elif group in exp.fewshot:
            e = exp.fewshot[group]
            if is_ctrl:
                split_of[i] = TRAIN
            elif pert in e.test or pert in e.val:
                split_of[i] = TEST if pert in e.test else VAL
            else:
                u = np.array([stable_unit(manifest.seed, "cellload", ds, ct, pert)])
                split_of[i] = _by_fraction(u, e.val_fraction, e.test_fraction)[0]
        elif exp.training.get(ds) == "train":
            split_of[i] = TRAIN
        else:
            split_of[i] = DROPPED
    for table, keys in (("zeroshot", exp.zeroshot), ("fewshot", exp.fewshot)):
        unknown = sorted(set(keys) - seen_groups)
        if unknown:
            raise ManifestError(
                exp.path,
                f"{table}.{unknown[0]}",
                "no such dataset.celltype in the sources; "
                f"they hold {sorted(seen_groups)[:10]} (cell types from fields.cell_type)",
            )
    for group, e in exp.fewshot.items():
        present = {
            perts[int(q) % n_p]
            for q in uniq.tolist()
            if f"{ds_of_source[int(q) // (n_ct * n_p)]}.{ct_names[int(q) // n_p % n_ct]}" == group
        }
        absent = sorted((set(e.val) | set(e.test)) - present)
        if absent:
            log.warning(
                "%s: [fewshot.%s] lists perturbations not in the data: %s",
                exp.path,
                group,
                absent[:10],
            )
        both = sorted(set(e.val) & set(e.test) & present)
        if both:
            log.warning(
                "%s: [fewshot.%s] lists %d perturbation(s) in both val and test; they go to test: %s",
                exp.path,
                group,
                len(both),
                both[:10],
            )
    return split_of[inv.ravel()]


__all__ = ["DROPPED", "TRAIN", "VAL", "TEST", "assign_cellload", "dataset_files", "source_datasets"]
