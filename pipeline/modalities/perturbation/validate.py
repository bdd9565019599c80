"""Checks that turn a malformed block into a SourceError naming the file and the first bad row.

A corrupt CSR block does not crash where it is read: scipy accepts most of it and the damage
surfaces later as a segfault in a kernel, a silent wrong gradient or an IndexError deep in a
loader. Checking every block as it is read costs a few vectorised passes and points the nightly
log at the exact row.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from pipeline.errors import SourceError
from pipeline.lazy import LazyModule

if TYPE_CHECKING:
    import scipy.sparse as sp
else:  # imported on first use (pipeline.lazy: declaring a source costs no heavy import)
    sp = LazyModule("scipy.sparse")


class CsrParts(NamedTuple):
    """A CSR block before scipy sees it (scipy's own checks raise bare ValueErrors, or none at all)."""

    data: np.ndarray
    indices: np.ndarray
    indptr: (
        np.ndarray
    )  # local to the block: indptr[0] is where the block's first row starts in data
    n_cols: int


def _first(mask: np.ndarray) -> int:
    """Index of the first True; the caller has already established that there is one."""
    return int(np.argmax(mask))


def _row_of(entry: int, indptr: np.ndarray) -> int:
    """Block-local row holding data entry `entry` (offsets relative to indptr[0])."""
    return int(np.searchsorted(indptr, indptr[0] + entry, side="right")) - 1


def validate_indptr(
    indptr: np.ndarray, path: str | Path, row0: int, nnz: int | None = None
) -> None:
    """Check row pointers alone, before they are used to slice data out of a file."""
    indptr = np.asarray(indptr)
    if indptr.ndim != 1 or indptr.size == 0:
        raise SourceError(
            path, f"row {row0}: indptr block must be 1-D and non-empty, got shape {indptr.shape}"
        )
    if indptr.dtype.kind not in "iu":
        raise SourceError(path, f"row {row0}: indptr has non-integer dtype {indptr.dtype}")
    if indptr[0] < 0:
        raise SourceError(path, f"row {row0}: negative indptr value {int(indptr[0])}")
    steps = np.diff(indptr)
    if steps.size and steps.min() < 0:
        local = _first(steps < 0)
        raise SourceError(
            path,
            f"row {row0 + local}: non-monotonic indptr "
            f"(indptr[{row0 + local}]={int(indptr[local])} > indptr[{row0 + local + 1}]={int(indptr[local + 1])})",
        )
    if nnz is not None:
        span = int(indptr[-1] - indptr[0])
        if span != nnz:
            # the first row reaching past the stored entries is the one to look at; extra data
            # blames the last row
            ends = indptr[1:] - indptr[0]
            local = _first(ends > nnz) if span > nnz else max(indptr.size - 2, 0)
            raise SourceError(
                path,
                f"row {row0 + local}: indptr does not match data length "
                f"(indptr spans {span} entries, data/indices hold {nnz})",
            )


# Said after a counts violation: the manifest key that promised counts, and the two ways out.
COUNTS_FIX = (
    '(manifest [fields] values = "counts" promises raw integer counts: for normalised, log or scaled data '
    'set values = "any", or point [fields] matrix at the raw counts, e.g. "raw/X" or "layers/counts")'
)


def _not_integer(data: np.ndarray) -> np.ndarray:
    """Entries of a float array with a fractional part (log-normalised data in a counts matrix)."""
    return np.trunc(data) != data


SCAN = (
    1 << 16
)  # entries per step of the integer check: its temporaries stay in cache, no fresh pages


def _first_fraction(data: np.ndarray) -> int | None:
    """The first entry of a float array with a fractional part, or None: `_not_integer` in steps of
    SCAN into two small reused buffers (whole-block temporaries cost twice the time, in page
    faults)."""
    tmp = np.empty(min(SCAN, data.size), data.dtype)
    frac = np.empty(tmp.size, bool)
    for s in range(0, data.size, SCAN):
        x = data[s : s + SCAN]
        t, f = tmp[: x.size], frac[: x.size]
        np.trunc(x, out=t)
        np.not_equal(t, x, out=f)
        if f.any():
            return s + _first(f)
    return None


def _check_values(
    data: np.ndarray, counts: bool, extremes: tuple[float, float] | None = None
) -> tuple[int, str] | None:
    """(first bad entry, problem) for non-finite or (counts) negative values, else None.
    `extremes`: data's (min, max) where the caller has them (`check_float32_exact`)."""
    lo = None
    if data.dtype.kind == "f" and data.size:
        # NaN propagates into both, an inf is an extreme: finite -> all are
        lo, hi = extremes if extremes is not None else (data.min(), data.max())
        if not (np.isfinite(lo) and np.isfinite(hi)):
            at = _first(~np.isfinite(data))
            return at, f"NaN or inf value ({data[at]}) in data"
    elif data.dtype.kind not in "iufb":
        return 0, f"data has non-numeric dtype {data.dtype}"
    if (
        counts
        and data.dtype.kind in "if"
        and data.size
        and (lo if lo is not None else data.min()) < 0
    ):
        at = _first(data < 0)
        return at, f"negative value ({data[at]}) in a counts matrix {COUNTS_FIX}"
    if counts and data.dtype.kind == "f" and data.size:
        at_frac = _first_fraction(data)
        if at_frac is not None:
            return at_frac, f"non-integer value ({data[at_frac]}) in a counts matrix {COUNTS_FIX}"
    return None


def validate_block(
    block: sp.csr_matrix | sp.csr_array | CsrParts | tuple[np.ndarray, np.ndarray, np.ndarray, int],
    path: str | Path,
    row0: int,
    counts: bool,
    extremes: tuple[float, float] | None = None,
) -> None:
    """Raise SourceError for the first structural or value problem in a CSR block starting at file
    row `row0`. `extremes`: the data's (min, max), where the caller has measured them.

    Accepts a scipy CSR matrix or the raw (data, indices, indptr, n_cols) parts: sources check
    the parts they read from disk before building the matrix, because scipy's constructor either
    raises an anonymous ValueError or (for out-of-range indices) nothing at all.
    """
    if isinstance(block, (sp.csr_matrix, sp.csr_array)):
        parts = CsrParts(block.data, block.indices, block.indptr, int(block.shape[1]))
    else:
        parts = CsrParts(*block)
    data, indices, indptr = (
        np.asarray(parts.data),
        np.asarray(parts.indices),
        np.asarray(parts.indptr),
    )
    if data.ndim != 1 or indices.ndim != 1:
        raise SourceError(
            path, f"row {row0}: data and indices must be 1-D, got {data.shape} and {indices.shape}"
        )
    if indices.size != data.size:
        raise SourceError(
            path,
            f"row {row0}: indices length {indices.size} does not match data length {data.size} in this block",
        )
    validate_indptr(indptr, path, row0, nnz=data.size)
    if indices.dtype.kind not in "iu":  # even when empty: such a file is malformed
        raise SourceError(
            path, f"row {row0}: column indices have non-integer dtype {indices.dtype}"
        )
    if indices.size:
        lo, hi = indices.min(), indices.max()
        if lo < 0 or hi >= parts.n_cols:
            at = _first((indices < 0) | (indices >= parts.n_cols))
            raise SourceError(
                path,
                f"row {row0 + _row_of(at, indptr)}: column index {int(indices[at])} out of range [0, {parts.n_cols})",
            )
    bad = _check_values(data, counts, extremes)
    if bad is not None:
        at, problem = bad
        raise SourceError(path, f"row {row0 + _row_of(at, indptr)}: {problem}")


def validate_dense(
    block: np.ndarray, path: str | Path, row0: int, counts: bool, n_cols: int | None = None
) -> None:
    """The dense-matrix twin of validate_block: shape, NaN/inf and (counts) negative values, by row."""
    block = np.asarray(block)
    if block.ndim != 2:
        raise SourceError(path, f"row {row0}: dense block must be 2-D, got shape {block.shape}")
    if n_cols is not None and block.shape[1] != n_cols:
        raise SourceError(
            path, f"row {row0}: dense block has {block.shape[1]} columns, expected {n_cols}"
        )
    if block.dtype.kind == "f":
        finite = np.isfinite(block)
        if not finite.all():
            row = _first(~finite.all(axis=1))
            col = _first(~finite[row])
            raise SourceError(
                path, f"row {row0 + row}: NaN or inf value ({block[row, col]}) at column {col}"
            )
    elif block.dtype.kind not in "iub":
        raise SourceError(path, f"row {row0}: dense block has non-numeric dtype {block.dtype}")
    if counts and block.dtype.kind in "if" and block.size and block.min() < 0:
        negative = block < 0
        row = _first(negative.any(axis=1))
        col = _first(negative[row])
        raise SourceError(
            path,
            f"row {row0 + row}: negative value ({block[row, col]}) in a counts matrix at column {col} {COUNTS_FIX}",
        )
    if counts and block.dtype.kind == "f" and block.size:
        frac = _not_integer(block)
        if frac.any():
            row = _first(frac.any(axis=1))
            col = _first(frac[row])
            raise SourceError(
                path,
                f"row {row0 + row}: non-integer value ({block[row, col]}) in a counts matrix at "
                f"column {col} {COUNTS_FIX}",
            )


FLOAT32_EXACT = 1 << 24  # every integer of magnitude <= 2**24 is a float32; 2**24 + 1 is not


def check_float32_exact(
    values: np.ndarray, path: str | Path, row0: int, indptr: np.ndarray | None, counts: bool
) -> tuple[float, float] | None:
    """Refuse values that float32 (the stored dtype of matrix values) would change: integers (from
    integer sources, and from float sources declared as counts: `[fields] values = "counts"`)
    beyond +-2**24, which it would round, and wider floats beyond float32's range, which would
    become inf. `indptr`: block-local row pointers to name the row of an entry (None: `values` is
    a dense 2-D block). Returns the values' (min, max) when it measured them (validate_block
    reuses them: two fewer passes over every block), else None."""
    values = np.asarray(values)
    kind = values.dtype.kind
    if (
        values.size == 0
        or kind not in "iuf"
        or (kind == "f" and values.dtype.itemsize <= 4 and not counts)
    ):
        return None
    whole = kind in "iu" or counts
    limit = float(FLOAT32_EXACT) if whole else float(np.finfo(np.float32).max)
    lo, hi = values.min(), values.max()  # two reductions, no copies (NaN: the slow path)
    # compared as Python floats: NumPy 2 would cast the limit to a float16 block's dtype, which
    # overflows (a RuntimeWarning from here, 12 in the fuzz test, for values that were fine)
    if -limit <= float(lo) and float(hi) <= limit:
        return lo, hi
    mag = np.abs(values.astype(np.float64, copy=False))  # float64 holds every int < 2**53
    big = (mag > limit) & (mag != np.inf)  # inf and NaN: reported as such by validate_block
    if not big.any():
        return None
    at = _first(big.ravel())
    row = row0 + (at // values.shape[1] if indptr is None else _row_of(at, indptr))
    if not whole:
        raise SourceError(
            path,
            f"row {row}: value {values.ravel()[at]} is beyond float32's range (the stored "
            "dtype); rescale the matrix",
        )
    raise SourceError(
        path,
        f"row {row}: value {values.ravel()[at]} is beyond 2**24 = {FLOAT32_EXACT}, which the "
        "stored float32 values cannot hold exactly; rescale the matrix (e.g. normalise or log1p it, "
        'then set [fields] values = "any") or use a matrix without such counts ([fields] matrix)',
    )


def sum_duplicates(block: sp.csr_matrix) -> tuple[sp.csr_matrix, np.ndarray | None]:
    """One canonical CSR: entries repeating a column within a row are summed (the CPU densify sums
    them, a GPU scatter keeps the last, so leaving them makes the value depend on the path).
    Returns the block and per-row counts of entries removed, or (block, None) when no row repeats
    a column (the common case costs one pass; rows with unsorted but distinct columns are left as
    they are)."""
    idx, ptr = block.indices, block.indptr
    if (
        idx.size < 2 or block.has_canonical_format
    ):  # scipy's one C pass, no temporaries: sorted, no repeats
        return block, None
    step = np.diff(idx.astype(np.int64, copy=False))
    inner = np.ones(
        step.size, bool
    )  # step i compares entries i and i+1: False where a row starts at i+1
    starts = ptr[1:-1]
    inner[(starts[(starts > 0) & (starts < idx.size)] - 1).astype(np.int64)] = False
    if (step[inner] > 0).all():
        return block, None
    summed = block.copy()
    summed.sum_duplicates()
    if summed.nnz == block.nnz:
        return block, None
    return summed, np.diff(ptr).astype(np.int64) - np.diff(summed.indptr).astype(np.int64)
