"""CSR row gather and densify: scipy's own C++ kernels, or the public scipy API when they are
unusable.

``x[rows]`` and ``toarray()`` spend ~150 of ~420 us per 256-row batch validating indices in
Python; the kernels behind them (``scipy.sparse._sparsetools.csr_row_index`` / ``csr_todense``)
do the work alone and write into caller buffers. ``_sparsetools`` is private, so it is checked
once against the public API on import and ignored if it moved or disagrees; then the same
functions run through ``scipy.sparse`` (slower, allocating, same results). Our rows are in range
by construction (every shard is validated before use).

This is the only module that touches those kernels; the loader's batch gathers and the pipeline's
pack use it. ``use_fallback(True)`` forces the public path (the test suite runs both ways).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp


class KernelError(RuntimeError):
    """Neither scipy's kernels nor its public API could gather CSR rows (a broken scipy
    installation)."""


def _probe() -> tuple[Any, Any] | None:
    try:
        from scipy.sparse import _sparsetools  # import weight: scipy, only for csr fields

        row_index, todense = _sparsetools.csr_row_index, _sparsetools.csr_todense
        x = sp.random(7, 5, density=0.5, format="csr", dtype=np.float32, random_state=0)
        rows = np.array([3, 0, 3, 6], x.indptr.dtype)
        nnz = x.indptr[rows + 1] - x.indptr[rows]
        crow = np.concatenate([[0], np.cumsum(nnz)]).astype(x.indptr.dtype)
        cols, vals = np.empty(int(crow[-1]), x.indices.dtype), np.empty(int(crow[-1]), x.dtype)
        row_index(rows.size, rows, x.indptr, x.indices, x.data, cols, vals)
        out = np.zeros((rows.size, 5), np.float32)
        todense(rows.size, 5, crow, cols, vals, out)
        return (row_index, todense) if np.array_equal(out, x[rows].toarray()) else None
    except Exception:  # not there, or a different signature
        return None


_NATIVE = _probe()
_force_fallback = False


def use_fallback(on: bool) -> None:
    """Force (True) or stop forcing (False) the public-API path."""
    global _force_fallback
    _force_fallback = bool(on)


def native() -> bool:
    """Whether the fast kernels are in use."""
    return _NATIVE is not None and not _force_fallback


def row_gather(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    rows: np.ndarray,
    out_indices: np.ndarray | None = None,
    out_data: np.ndarray | None = None,
    n_cols: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``rows`` of the CSR ``(indptr, indices, data)``, in order: ``(crow, indices, data)``
    with ``crow`` in ``indptr``'s dtype. ``out_*`` (exactly the right length) receive the entries
    when given."""
    r = np.asarray(rows).astype(indptr.dtype, copy=False).reshape(-1)
    crow = np.empty(r.size + 1, indptr.dtype)
    crow[0] = 0
    np.cumsum(indptr[r + 1] - indptr[r], out=crow[1:])
    nnz = int(crow[-1])
    cols = np.empty(nnz, indices.dtype) if out_indices is None else out_indices
    vals = np.empty(nnz, data.dtype) if out_data is None else out_data
    if native():
        _NATIVE[0](r.size, r, indptr, indices, data, cols, vals)  # type: ignore[index]
        return crow, cols, vals
    try:
        width = int(indices.max(initial=-1)) + 1 if n_cols is None else int(n_cols)
        y = sp.csr_matrix((data, indices, indptr), shape=(indptr.size - 1, max(width, 1)))[r]
        cols[...], vals[...] = y.indices, y.data
    except Exception as e:
        raise KernelError(
            f"cannot gather CSR rows with scipy {sp.__name__} ({type(e).__name__}: {e}); "
            "reinstall scipy (>= 1.11)"
        ) from e
    return crow, cols, vals


def flat_positions(crow: np.ndarray, indices: np.ndarray, n_cols: int) -> np.ndarray:
    """int64 ``row * n_cols + col`` of every entry of CSR rows: where each value lands in the
    flattened dense batch. Made on the host (~45 us for 51k entries, in a DataLoader worker) so
    that a device densifies with two kernels (zero, scatter) instead of rebuilding row ids from
    ``crow`` (~10 launches, ~0.3 ms of the training thread a batch on an H100 node)."""
    rows = np.arange(crow.size - 1, dtype=np.int64)
    rows *= n_cols
    pos = np.repeat(rows, np.diff(crow))
    pos += indices
    return pos


ZERO_BLOCK_ROWS = (
    32  # rows zeroed then filled together: ~256 KB at 2,000 genes, still in the core's cache
)


def densify(
    crow: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    n_cols: int,
    out: np.ndarray | None = None,
    zeroed: bool = True,
) -> np.ndarray:
    """Dense float32 ``[m, n_cols]`` of CSR rows; into ``out`` (float32) when given. Without ``out``
    the result is calloc'ed: fresh zero pages, no memset. ``zeroed=False``: ``out`` holds old
    bytes (a reused ring slot); it is zeroed a block of rows at a time, each block filled while
    still in cache (a separate memset of the whole batch first went to DRAM and back: 2.3x the
    densify's own time in a DataLoader worker)."""
    m = crow.size - 1
    vals = data if data.dtype == np.float32 else data.astype(np.float32)
    dense = np.zeros((m, n_cols), np.float32) if out is None else out.reshape(m, n_cols)
    if native():
        idx = np.result_type(crow.dtype, indices.dtype)
        crow, indices = crow.astype(idx, copy=False), indices.astype(idx, copy=False)
        if out is None or zeroed:
            _NATIVE[1](m, n_cols, crow, indices, vals, dense)  # type: ignore[index]
            return dense
        for a in range(
            0, m, ZERO_BLOCK_ROWS
        ):  # crow slices keep absolute offsets into indices/vals
            b = min(a + ZERO_BLOCK_ROWS, m)
            block = dense[a:b]
            block.fill(0)
            _NATIVE[1](b - a, n_cols, crow[a : b + 1], indices, vals, block)  # type: ignore[index]
        return dense
    if out is not None and not zeroed:
        dense.fill(0)
    try:
        sp.csr_matrix((vals, indices, crow), shape=(m, n_cols), copy=False).toarray(out=dense)
    except Exception as e:
        raise KernelError(
            f"cannot densify CSR rows with scipy ({type(e).__name__}: {e}); reinstall scipy"
        ) from e
    return dense
