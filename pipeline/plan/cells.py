"""The cell table: every source row as global integer codes, vocabularies shared by all sources.

Missing perturbation labels cannot be conditioned on: such rows are dropped, counted and logged.
Missing values of other fields become the label "NA".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.errors import SourceError
from pipeline.manifest import Manifest
from pipeline.scan import ScannedSource
from pipeline.sources import Categorical

log = logging.getLogger(__name__)
MISSING = "NA"


@dataclass
class CellTable:
    """Columns over the kept cells of all sources (vectorised plan input)."""

    source: np.ndarray  # int32 source ordinal
    row: np.ndarray  # int64 row in its source file
    sample_id: np.ndarray  # int64 position in the concatenation of all sources
    codes: dict[str, np.ndarray]  # logical field -> int32 global codes
    is_control: np.ndarray  # bool
    vocabularies: dict[str, list[str]]
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count

    def __len__(self) -> int:
        return int(self.row.size)

    def cell_types(self) -> tuple[np.ndarray, list[str]]:
        """Cell type codes and names; without a cell type field, every cell is of one unnamed type."""
        if "cell_type" in self.codes:
            return self.codes["cell_type"], self.vocabularies["cell_type"]
        return np.zeros(len(self), np.int32), [""]

    def subset(self, keep: np.ndarray, reason: str) -> CellTable:
        """The kept cells (vocabularies unchanged), the others counted under `reason`."""
        dropped = dict(self.dropped)
        n = int((~keep).sum())
        if n:
            dropped[reason] = dropped.get(reason, 0) + n
        return CellTable(self.source[keep], self.row[keep], self.sample_id[keep],
                         {f: c[keep] for f, c in self.codes.items()}, self.is_control[keep], self.vocabularies, dropped)


def _labels(cat: Categorical) -> tuple[np.ndarray, np.ndarray]:
    """Used category strings and codes into them, with missing values mapped to MISSING."""
    cats = np.asarray(list(cat.categories) + [MISSING], dtype=object)
    codes = np.where(cat.codes < 0, len(cat.categories), cat.codes)
    used = np.unique(codes)
    return cats[used].astype(str), np.searchsorted(used, codes)


def build_cell_table(manifest: Manifest, scanned: Sequence[ScannedSource]) -> CellTable:
    fields = manifest.config.fields.obs_fields
    per_source = [{f: _labels(s.obs[f]) for f in fields} for s in scanned]
    vocab: dict[str, list[str]] = {}
    for f in fields:
        vocab[f] = sorted(set().union(*(set(p[f][0].tolist()) for p in per_source)))
    controls = set(manifest.config.fields.control)
    control_codes = np.array(sorted(vocab["perturbation"].index(c) for c in controls if c in vocab["perturbation"]))

    src_l, row_l, sid_l, ctrl_l = [], [], [], []
    codes_l: dict[str, list[np.ndarray]] = {f: [] for f in fields}
    dropped: dict[str, int] = {}
    offset = 0
    for s, p in zip(scanned, per_source, strict=True):
        n = s.meta.n_rows
        glob = {}
        for f in fields:
            names, local = p[f]
            lookup = np.searchsorted(np.asarray(vocab[f], dtype=object).astype(str), names).astype(np.int32)
            glob[f] = lookup[local]
        pert_missing = s.obs["perturbation"].codes < 0
        keep = ~pert_missing
        if pert_missing.any():
            k = int(pert_missing.sum())
            dropped["missing perturbation label"] = dropped.get("missing perturbation label", 0) + k
            log.warning("%s: %d cells have no perturbation label and are not packed", s.spec.path, k)
        is_ctrl = np.isin(glob["perturbation"], control_codes) & keep
        if not is_ctrl.any():
            found = ", ".join(p["perturbation"][0][:5].tolist())
            raise SourceError(s.spec.path, f"no control cells: none of the control labels {sorted(controls)} occur "
                              f"in obs column {manifest.config.fields.perturbation!r} (labels include: {found})")
        rows = np.flatnonzero(keep)
        src_l.append(np.full(rows.size, s.ordinal, np.int32))
        row_l.append(rows.astype(np.int64))
        sid_l.append(rows.astype(np.int64) + offset)
        ctrl_l.append(is_ctrl[rows])
        for f in fields:
            codes_l[f].append(glob[f][rows])
        offset += n
    return CellTable(
        source=np.concatenate(src_l),
        row=np.concatenate(row_l),
        sample_id=np.concatenate(sid_l),
        codes={f: np.concatenate(codes_l[f]).astype(np.int32) for f in fields},
        is_control=np.concatenate(ctrl_l),
        vocabularies=vocab,
        dropped=dropped,
    )
