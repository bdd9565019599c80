"""Condition vectors: one row per distinct (perturbation, cell type, batch, covariates) combination.

Stored once per dataset; every cell carries only its `cond_id`. The vector is the concatenation
of one-hot blocks per field, or, for the perturbation block, a feature vector from a user table
(npz/csv/npy: never pickle). With a combination separator the perturbation block is the sum of
the vectors of a label's parts ("A_B" = A + B, a control = zeros), so a model sees that a double
perturbation shares its genes with the singles; numeric covariates (dose, time) are one column
each, a transformed number rather than a one-hot of values.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from pipeline.errors import ManifestError
from pipeline.modalities.perturbation.matrix import code_dtype
from pipeline.modalities.perturbation.pairing import combine


@dataclass(frozen=True)
class VectorOptions:
    """How labels become vector blocks (defaults: one-hot everything, as before these options
    existed)."""

    separator: str | None = None  # combination separator of perturbation labels
    controls: tuple[str, ...] = ()  # control labels: the zero vector under a separator
    numeric: tuple[str, ...] = ()  # fields whose labels are numbers
    transform: str = "log1p"  # applied to numeric fields
    manifest: str = "manifest"  # named in errors


TRANSFORMS = {"log1p": np.log1p, "none": lambda v: v}


@dataclass
class ConditionTable:
    """Per cell its condition id; per condition its codes, and its vector, made on first use
    (`vectors`): the vectors grow with the dataset (conditions x dimensions, 27 MB at 2M cells
    here) and are needed only to write the table, so they are not held while the plan's
    per-source temporaries are."""

    cond_id: (
        np.ndarray
    )  # [n_cells], smallest signed type for the number of conditions (planned columns: int32)
    codes: np.ndarray  # int32 [C, F]
    segments: list[dict[str, object]]  # field, offset, size, encoding
    per_label: list[
        np.ndarray | None
    ]  # per field: its vector part of each label [V, size], None for one-hot

    def drop_vectors(self) -> None:
        """Forget the vectors once written (a pipelined build writes them before it plans the
        sources): the next `vectors` makes them again."""
        self.__dict__.pop("vectors", None)

    @cached_property
    def vectors(self) -> np.ndarray:
        """float32 [C, D]: each field's part of every condition's vector, filled in place (no
        per-field blocks, concatenation and cast: three copies of the table)."""
        if not self.segments:
            return np.zeros((1, 0), np.float32)
        out = np.zeros(
            (self.codes.shape[0], sum(int(g["size"]) for g in self.segments)), np.float32
        )  # type: ignore[call-overload]
        for j, (seg, labels) in enumerate(zip(self.segments, self.per_label, strict=True)):
            at = int(seg["offset"])  # type: ignore[call-overload]
            if labels is None:
                out[np.arange(self.codes.shape[0]), at + self.codes[:, j]] = 1.0
            else:
                out[:, at : at + labels.shape[1]] = labels[self.codes[:, j]]
        return out


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
                            raise ManifestError(
                                path, "perturbation_features", f"non-numeric row {row[0]!r}"
                            ) from None
    else:  # .npy: rows in the order of the sorted perturbation vocabulary
        arr = np.load(path, allow_pickle=False)
        if arr.ndim != 2 or arr.shape[0] != len(names):
            raise ManifestError(
                path, "perturbation_features", f"npy needs shape [{len(names)}, d], got {arr.shape}"
            )
        return arr.astype(np.float32)
    dims = {v.size for v in table.values()}
    if len(dims) != 1:
        raise ManifestError(
            path, "perturbation_features", f"rows have different lengths {sorted(dims)}"
        )
    dim = dims.pop()
    missing = [n for n in names if n not in table and n not in controls]
    if missing:
        raise ManifestError(
            path, "perturbation_features", f"no features for perturbations {missing[:5]}"
        )
    return np.stack([table.get(n, np.zeros(dim, np.float32)) for n in names]).astype(np.float32)


def split_combinations(
    names: Sequence[str], separator: str, controls: Sequence[str]
) -> tuple[list[str], list[list[int]]]:
    """The sorted vocabulary of single perturbations and, per label, the positions of its parts.
    Parts equal to a control label are dropped (GEARS writes "AHR+ctrl"); a control (or missing)
    label has no parts."""
    skip = set(controls) | {"NA"}
    parts = [
        [] if n in skip else [p for p in n.split(separator) if p and p not in skip] for n in names
    ]
    singles = sorted({p for ps in parts for p in ps})
    pos = {p: i for i, p in enumerate(singles)}
    return singles, [[pos[p] for p in ps] for ps in parts]


def combination_matrix(
    names: Sequence[str], opts: VectorOptions, features: np.ndarray | None
) -> np.ndarray:
    """[labels, d]: each label's vector, the sum of its parts' one-hot (or feature) rows."""
    assert opts.separator is not None
    singles, parts = split_combinations(names, opts.separator, opts.controls)
    rows = features if features is not None else np.eye(len(singles), dtype=np.float32)
    out = np.zeros((len(names), rows.shape[1]), np.float32)
    for i, ps in enumerate(parts):
        for p in ps:
            out[i] += rows[p]
    return out


def numeric_values(field: str, names: Sequence[str], opts: VectorOptions) -> np.ndarray:
    """[labels, 1]: the transformed number of each label of a numeric covariate."""
    try:
        values = np.array([float(n) for n in names], np.float64)
    except ValueError:
        bad = [n for n in names if not _is_number(n)][:5]
        raise ManifestError(
            opts.manifest,
            "fields.numeric_covariates",
            f"obs column {field!r} has values that are "
            f'not numbers {bad} ("NA" = missing): fill them in the file, or list the column under '
            "fields.covariates to one-hot its labels instead",
        ) from None
    if opts.transform == "log1p" and (values < 0).any():
        raise ManifestError(
            opts.manifest,
            "fields.numeric_transform",
            f"obs column {field!r} has negative values "
            f'(min {values.min()}), which log1p cannot take: set numeric_transform = "none"',
        )
    return TRANSFORMS[opts.transform](values).astype(np.float32)[:, None]


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


DENSE_KEYS = 1 << 24  # combination spaces up to this size are counted in a table, not sorted


def distinct_rows(cols: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(row of each cell in the table, the table): the distinct tuples of `cols`, sorted like
    np.unique.

    When the product of the columns' ranges is small (the usual case: conditions number
    thousands), a presence table over that space replaces the sort: int32 keys built in place and
    one lookup, instead of np.unique's int64 sort, index and inverse arrays (~100 bytes a cell at
    once: the plan's peak memory)."""
    n = cols[0].size if cols else 0
    sizes = [int(c.max(initial=0)) + 1 for c in cols]
    space = int(np.prod(sizes, dtype=np.float64)) if cols else 1
    if not cols or space > DENSE_KEYS:
        keys = np.stack(list(cols), axis=1).astype(np.int32) if cols else np.zeros((n, 0), np.int32)
        packed = (
            combine(*(keys[:, j] for j in range(keys.shape[1]))) if cols else np.zeros(n, np.int64)
        )
        _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
        return inverse.ravel().astype(np.int32), keys[first]
    key = np.zeros(n, np.int32)
    for c, size in zip(cols, sizes, strict=True):
        key *= size  # mixed radix, as pairing.combine: the order of the tuples
        key += c
    present = np.zeros(space, bool)
    present[key] = True
    uniq = np.flatnonzero(present)
    ids = np.zeros(space, np.int32)
    ids[uniq] = np.arange(uniq.size, dtype=np.int32)
    table = np.empty((uniq.size, len(cols)), np.int32)
    rest = uniq.copy()
    for j in range(len(cols) - 1, -1, -1):
        table[:, j] = rest % sizes[j]
        rest //= sizes[j]
    return ids[key], table


def build_conditions(
    codes: Mapping[str, np.ndarray],
    fields: Sequence[str],
    vocab: Mapping[str, list[str]],
    features: np.ndarray | None = None,
    opts: VectorOptions = VectorOptions(),
) -> ConditionTable:
    inverse, table = distinct_rows([codes[f] for f in fields])
    per_label: list[np.ndarray | None] = []
    segments: list[dict[str, object]] = []
    offset = 0
    for f in fields:
        extra: dict[str, object] = {}
        labels: np.ndarray | None = None
        if f == "perturbation" and opts.separator is not None:
            labels = combination_matrix(vocab[f], opts, features)
            enc = "combination"
            extra = {
                "separator": opts.separator,
                "encoding_of_parts": "features" if features is not None else "onehot",
                "parts": split_combinations(vocab[f], opts.separator, opts.controls)[0],
            }
        elif f == "perturbation" and features is not None:
            labels = features
            enc = "features"
        elif f in opts.numeric:
            labels = numeric_values(f, vocab[f], opts)
            enc, extra = "numeric", {"transform": opts.transform}
        else:
            enc = "onehot"
        width = int(labels.shape[1]) if labels is not None else len(vocab[f])
        per_label.append(labels)
        segments.append({"field": f, "offset": offset, "size": width, "encoding": enc, **extra})
        offset += width
    # every cell's id is held while planning: a compact type, as the cell table's codes (plan.cells)
    return ConditionTable(
        inverse.astype(code_dtype(table.shape[0]), copy=False), table, segments, per_label
    )
