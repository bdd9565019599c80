"""The cell table: every source row as global integer codes, vocabularies shared by all sources.

Missing perturbation labels cannot be conditioned on: such rows are dropped, counted and logged.
Missing values of other fields become the label "NA".
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.errors import SourceError
from pipeline.manifest import Manifest
from pipeline.modalities.perturbation.matrix import Categorical, code_dtype
from pipeline.model import ScannedSource

log = logging.getLogger(__name__)
MISSING = "NA"


@dataclass
class CellTable:
    """Columns over the kept cells of all sources (vectorised plan input).

    The plan holds them for every cell of the dataset at once (its peak memory at millions of
    cells), so each is in the smallest type its range allows (a few bytes a cell in all), and the
    sample id is not stored: it is the row plus its source's offset. Shard columns are
    int32/int64 whatever these types."""

    source: np.ndarray  # source ordinal (smallest integer type for the number of sources)
    row: np.ndarray  # row in its source file (int32 below 2**31 rows a file, else int64)
    offsets: (
        np.ndarray
    )  # int64 [ordinal]: sample id of each source's row 0 (rows of the sources before it)
    codes: dict[
        str, np.ndarray
    ]  # logical field -> global codes (smallest signed type for the vocabulary)
    is_control: np.ndarray  # bool
    vocabularies: dict[str, list[str]]
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count

    def __len__(self) -> int:
        return int(self.row.size)

    def sample_ids(self, cells: np.ndarray) -> np.ndarray:
        """int64 position of these cells in the concatenation of all sources."""
        return self.row[cells].astype(np.int64) + self.offsets[self.source[cells]]

    def codes32(self, f: str, cells: np.ndarray) -> np.ndarray:
        """Field `f`'s codes of these cells as int32 (the type of the planned columns and of every
        per-source computation)."""
        return self.codes[f][cells].astype(np.int32)

    def cell_types(self) -> tuple[np.ndarray, list[str]]:
        """Cell type codes and names; without a cell type field, every cell is of one unnamed type."""
        if "cell_type" in self.codes:
            return self.codes["cell_type"], self.vocabularies[
                "cell_type"
            ]  # a compact type: index or widen
        return np.zeros(len(self), np.int32), [""]

    def subset(self, keep: np.ndarray, reason: str) -> CellTable:
        """The kept cells (vocabularies unchanged), the others counted under `reason`."""
        dropped = dict(self.dropped)
        n = int((~keep).sum())
        if n:
            dropped[reason] = dropped.get(reason, 0) + n
        return CellTable(
            self.source[keep],
            self.row[keep],
            self.offsets,
            {f: c[keep] for f, c in self.codes.items()},
            self.is_control[keep],
            self.vocabularies,
            dropped,
        )


def _categories(cat: Categorical) -> np.ndarray:
    """The column's categories plus MISSING last, as strings: code -1 indexes the last, MISSING."""
    return np.asarray([*cat.categories, MISSING], dtype=object).astype(str)


def _used(cat: Categorical) -> np.ndarray:
    """The category strings the column uses (MISSING for missing values), in category order."""
    present = np.zeros(len(cat.categories) + 1, bool)
    present[cat.codes] = True
    return _categories(cat)[present]


def no_controls(controls: set[str], used: list[str], column: str) -> str:
    """The error for a source without control cells: the labels that differ from a control label
    only by case or a typo come first (a wrong-case ``"control"`` is the common mistake), then a
    few others."""
    lower = {c.lower() for c in controls}
    near = [u for u in used if u.lower() in lower]
    near += [
        u
        for c in sorted(controls)
        for u in difflib.get_close_matches(c, used, n=3, cutoff=0.75)
        if u not in near
    ]
    others = [u for u in used if u not in near][: max(0, 5 - len(near))]
    hint = f"; did you mean {', '.join(map(repr, near))}?" if near else ""
    return (
        f"no control cells: none of the control labels {sorted(controls)} occur in obs column {column!r} "
        f"(labels include: {', '.join(near + others)}{hint} Labels are case-sensitive: set [fields] control)"
    )


def build_cell_table(manifest: Manifest, scanned: Sequence[ScannedSource]) -> CellTable:
    """The table, filled source by source into preallocated compact arrays: a source's codes go
    straight from its categories to the shared vocabularies (one int32 lookup), so the build
    holds no per-cell temporaries beyond one source's: the plan's per-cell state is the build's
    peak memory at millions of cells."""
    fields = manifest.config.fields.obs_fields
    vocab: dict[str, list[str]] = {}
    for f in fields:
        vocab[f] = sorted(set().union(*(set(_used(s.obs[f]).tolist()) for s in scanned)))
    sorted_vocab = {f: np.asarray(v, dtype=object).astype(str) for f, v in vocab.items()}
    controls = set(manifest.config.fields.control)
    control_codes = np.array(
        sorted(vocab["perturbation"].index(c) for c in controls if c in vocab["perturbation"])
    )

    kept = [int((s.obs["perturbation"].codes >= 0).sum()) for s in scanned]
    total = sum(kept)
    longest = max((s.meta.n_rows for s in scanned), default=0)
    source = np.empty(total, code_dtype(max((s.ordinal for s in scanned), default=0) + 1))
    row = np.empty(total, np.int32 if longest <= np.iinfo(np.int32).max else np.int64)
    offsets = np.zeros(max((s.ordinal for s in scanned), default=0) + 1, np.int64)
    codes = {f: np.empty(total, code_dtype(len(vocab[f]))) for f in fields}
    is_control = np.empty(total, bool)
    dropped: dict[str, int] = {}
    offset = at = 0
    for s, k in zip(scanned, kept, strict=True):
        n = s.meta.n_rows
        pert_missing = s.obs["perturbation"].codes < 0
        if pert_missing.any():
            dropped["missing perturbation label"] = (
                dropped.get("missing perturbation label", 0) + n - k
            )
            log.warning(
                "%s: %d cells have no perturbation label and are not packed", s.spec.path, n - k
            )
        rows = np.flatnonzero(~pert_missing)
        part = slice(at, at + k)
        for f in fields:
            cats = _categories(s.obs[f])
            lookup = (
                np.searchsorted(sorted_vocab[f], cats).clip(0, len(vocab[f]) - 1).astype(np.int32)
            )
            codes[f][part] = lookup[
                s.obs[f].codes[rows]
            ]  # unused categories map anywhere: never indexed
        is_control[part] = np.isin(codes["perturbation"][part], control_codes)
        if not is_control[part].any():
            raise SourceError(
                s.spec.path,
                no_controls(
                    controls,
                    _used(s.obs["perturbation"]).tolist(),
                    manifest.config.fields.perturbation,
                ),
            )
        source[part] = s.ordinal
        row[part] = rows
        offsets[s.ordinal] = offset
        offset += n
        at += k
    return CellTable(
        source=source,
        row=row,
        offsets=offsets,
        codes=codes,
        is_control=is_control,
        vocabularies=vocab,
        dropped=dropped,
    )
