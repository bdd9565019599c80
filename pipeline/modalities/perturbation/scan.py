"""Stage 1: resolve sources, fingerprint them and read metadata only. Fails early, naming the file."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.errors import ManifestError, SourceError
from pipeline.fingerprint import fingerprint
from pipeline.manifest import Manifest, SourceSpec
from pipeline.modalities.perturbation.matrix import Categorical, SourceMeta, open_source
from pipeline.model import ScannedSource
from pipeline.source import infer_type

log = logging.getLogger(__name__)
PROBE_ROWS = (
    256  # rows read at scan time to check a counts matrix (every row is checked again when packed)
)
# A [fields] covariates column stored as numbers is a measurement, not labels, when a value has a
# fraction or when it has more distinct whole numbers than this (check_covariates).
MAX_WHOLE_NUMBER_LABELS = 16


def scan_source(
    ordinal: int,
    spec: SourceSpec,
    manifest: Manifest,
    cache: Mapping[str, Mapping[str, object]] | None = None,
    hasher: Executor | None = None,
) -> ScannedSource:
    fields = manifest.config.fields
    columns = [fields.column(f) for f in fields.obs_fields]
    counts = fields.values == "counts"
    with open_source(spec.type, spec.path, spec.matrix, counts=counts) as src:
        # a missing column is reported below, with its manifest key; barcodes are checked, not read
        # (a plug-in source written before `names` existed reads them)
        lean = {"names": False} if "names" in inspect.signature(src.meta).parameters else {}
        meta = src.meta(columns, optional=columns, **lean)
        if (
            counts and meta.n_rows
        ):  # normalised data under values = "counts": fail now, before any output
            src.read_rows(0, min(meta.n_rows, PROBE_ROWS))
        unset = [f for f in ("cell_type", "batch") if getattr(fields, f) is None]
        if unset:
            _hint_unset(spec.path, unset, src.obs_columns())
        obs: dict[str, Categorical] = {}
        for logical, col in zip(fields.obs_fields, columns, strict=True):
            filled = None if col in meta.obs else src.fill_obs(logical, meta.n_rows)
            if col in meta.obs:
                obs[logical] = meta.obs[col]
            elif (
                filled is not None
            ):  # e.g. cell-load's cell type from the file stem (the source's rule)
                obs[logical] = filled
            else:
                raise SourceError(
                    spec.path,
                    missing_column(logical, col, src.obs_columns())
                    + type_hint(spec, manifest.kind),
                )
        obs = {logical: cat.compact() for logical, cat in obs.items()}
    for key in fields.obsm:
        if key not in meta.obsm:
            raise SourceError(spec.path, f"missing obsm key {key!r} (has: {sorted(meta.obsm)})")
    if meta.n_rows == 0:
        raise SourceError(spec.path, "has no cells")
    if meta.n_cols == 0:
        raise SourceError(
            spec.path,
            f"matrix {spec.matrix!r} has no genes (0 columns): nothing to train on; "
            "check [fields] matrix (a layer or obsm key of this file?)",
        )
    return ScannedSource(
        ordinal,
        spec,
        fingerprint(spec.path, cache)
        if hasher is None
        else hasher.submit(fingerprint, spec.path, cache),
        compact_meta(meta),
        obs,
        meta.obs_names is not None or meta.has_obs_names,
    )


def compact_meta(meta: SourceMeta) -> SourceMeta:
    """What the build keeps of a source's metadata until it ends, in a few bytes a cell: the per-row
    entry counts as int32 (a row has at most n_cols entries), without the obs columns (the scan
    keeps them compact under their logical names) and without the cell barcodes (checked here,
    read again per source by the plan and by nothing else). The plan holds this for every source
    at once: at millions of cells it is the peak."""
    nnz = meta.row_nnz
    if nnz.dtype.itemsize > 4 and meta.n_cols <= np.iinfo(np.int32).max:
        nnz = nnz.astype(np.int32)
    return replace(meta, row_nnz=nnz, obs={}, obs_names=None)


LIKELY = {
    "cell_type": ("cell_type", "celltype", "cell_line"),
    "batch": ("batch", "gem_group", "gemgroup"),
}


def _hint_unset(path: Path, unset: Sequence[str], available: Sequence[str]) -> None:
    """`cell_type` and `batch` are optional (absent = none): say so when the file seems to have one."""
    for field in unset:
        found = [c for c in LIKELY[field] if c in available]
        if found:
            log.warning(
                "%s: [fields] %s is not set, so the build ignores obs column %r; set %s = %r to use it",
                path,
                field,
                found[0],
                field,
                found[0],
            )


def type_hint(spec: SourceSpec, kind: str) -> str:
    """When the file's suffix belongs to another source type than the one read: say so (``type =
    "h5csr"`` on an ``.h5ad`` finds no obs columns, which reads like a missing column, not a
    wrong type)."""
    claimed = infer_type(str(spec.path), kind)
    if claimed is None or claimed == spec.type:
        return ""
    return (
        f". The file was read as source type {spec.type!r}, but its suffix is that of type {claimed!r}: "
        f"set [[sources]] type = {claimed!r} (or leave type out)"
    )


def missing_column(logical: str, column: str, available: Sequence[str]) -> str:
    """The error for an obs column the manifest names and the file lacks: which key named it, what
    the file has, and how to fix it."""
    if logical in ("perturbation", "cell_type", "batch"):
        key, fix = (
            f"[fields] {logical} = {column!r}",
            f"set [fields] {logical} to one of the file's columns",
        )
        if logical != "perturbation":
            fix += f', or leave {logical} out (or "") if the data has none'
    else:
        key = "listed in [fields] covariates or numeric_covariates"
        fix = "remove it from that list or name a column the file has"
    cols = ", ".join(available[:30]) or "none"
    return f"missing obs column {column!r} ({key}); the file's obs columns: {cols}. Fix: {fix}"


def scan(
    manifest: Manifest,
    cache: Mapping[str, Mapping[str, object]] | None = None,
    hasher: Executor | None = None,
) -> list[ScannedSource]:
    """Scan every source. With a `hasher`, content hashes of new or changed files (a full read of
    each file) run there, overlapping the metadata reads and most of the plan, which needs them
    only for keys."""
    scanned = [scan_source(i, s, manifest, cache, hasher) for i, s in enumerate(manifest.sources)]
    check_consistent(scanned)
    check_covariates(manifest, scanned)
    return scanned


def check_covariates(manifest: Manifest, scanned: Sequence[ScannedSource]) -> None:
    """Refuse a ``[fields] covariates`` column that holds measurements: one-hot, each distinct value
    becomes its own condition (a cell count ``n_genes`` gave 658 conditions for 10 labels), which
    no error or warning showed. The rule: the source stores the column as numbers (an int or
    float column, not a categorical or strings) and either a value has a fraction (0.5) or there
    are more than MAX_WHOLE_NUMBER_LABELS distinct values over all sources. A few whole numbers
    (a timepoint 24/48, a replicate 1/2/3) stay labels. ``numeric_covariates`` is the place for
    numbers; a column meant as labels can be stored as a categorical."""
    for column in manifest.config.fields.covariates:
        values: set[str] = set()
        files = []
        for s in scanned:
            cat = s.obs.get(column)
            if cat is not None and getattr(cat, "numeric", ""):
                values.update(cat.categories)
                files.append(s.spec.path.name)
        if not values:
            continue
        fractions = sorted(v for v in values if not _whole(v))
        if not fractions and len(values) <= MAX_WHOLE_NUMBER_LABELS:
            continue
        listed = fractions or sorted(values, key=_number)
        shown = ", ".join(listed[:5]) + (", ..." if len(listed) > 5 else "")
        why = (
            f"values with a fraction ({shown})"
            if fractions
            else f"{len(values)} distinct whole numbers (more than {MAX_WHOLE_NUMBER_LABELS})"
        )
        raise ManifestError(
            manifest.path,
            "fields.covariates",
            f"obs column {column!r} holds numbers ({why}, in {', '.join(files[:3])}): as a "
            f"covariate each of its {len(values)} values would be its own condition (one-hot). "
            "List it under numeric_covariates instead (one number in the condition vector, "
            "after numeric_transform), or, to one-hot it on purpose, store it in the file as a "
            "categorical column",
        )


def _number(label: str) -> float:
    try:
        return float(label)
    except ValueError:
        return float("nan")


def _whole(label: str) -> bool:
    """A label of a number column without a fraction ("24", "24.0"); NaN and inf count as fractions
    (a measurement column, whatever it holds)."""
    v = _number(label)
    return v == v and abs(v) != float("inf") and v.is_integer()


def check_consistent(scanned: Sequence[ScannedSource]) -> None:
    """All sources must share one gene space (same names, same order) and the same obsm widths. A
    file without gene names is combined with others only if its [[sources]] entry says
    `same_genes = true`: made-up names (gene_0, ...) would match whatever order the columns are
    in."""
    first = scanned[0]
    for s in scanned if len(scanned) > 1 else ():
        if not getattr(s.meta, "named_genes", True) and s.spec.option("same_genes") is not True:
            raise SourceError(
                s.spec.path,
                f"has no gene names (var index) and is combined with {len(scanned) - 1} "
                "other source(s): its columns may be other genes or another order. Write var names "
                "into the file, or set same_genes = true in its [[sources]] entry of the manifest "
                "if every source has the same genes in the same order",
            )
    for s in scanned[1:]:
        if s.meta.n_cols != first.meta.n_cols or s.meta.var_names != first.meta.var_names:
            raise SourceError(
                s.spec.path,
                f"gene space differs from {first.spec.path.name} "
                f"({s.meta.n_cols} vs {first.meta.n_cols} columns, or other names/order)",
            )
        for key, (shape, _dtype) in first.meta.obsm.items():
            if key in s.meta.obsm and s.meta.obsm[key][0][1:] != shape[1:]:
                raise SourceError(
                    s.spec.path, f"obsm[{key!r}] width {s.meta.obsm[key][0][1:]} != {shape[1:]}"
                )
