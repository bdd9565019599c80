"""loaders.samples.kernels: scipy's private CSR kernels and the public-API fallback give the same results,
the fallback runs in the default suite (every test here and one loader test run both ways), and a
broken scipy is a clear error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

from loaders.samples import kernels


@pytest.fixture(params=["native", "fallback"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "native" and kernels._NATIVE is None:
        pytest.skip("scipy's private kernels are not usable here")
    kernels.use_fallback(request.param == "fallback")
    try:
        yield request.param
    finally:
        kernels.use_fallback(False)


def _matrix(seed: int = 0) -> sp.csr_matrix:
    x = sp.random(300, 57, density=0.15, format="csr", dtype=np.float32, random_state=seed)
    x.data -= 0.5  # signed values
    x.data[x.indptr[7] : x.indptr[8]] = 0  # an empty row
    x.eliminate_zeros()
    return x


def test_row_gather_matches_scipy_indexing(path: str) -> None:
    assert kernels.native() == (path == "native")
    x = _matrix()
    rows = np.random.default_rng(1).integers(0, x.shape[0], 500)  # repeats and the empty row
    rows[3] = 7
    for dt in (np.int32, np.int64):
        crow, cols, vals = kernels.row_gather(
            x.indptr.astype(dt), x.indices.astype(dt), x.data, rows, n_cols=57
        )
        y = sp.csr_matrix((vals, cols, crow), shape=(rows.size, 57))
        np.testing.assert_array_equal(y.toarray(), x[rows].toarray())


def test_row_gather_into_caller_buffers(path: str) -> None:
    x = _matrix(2)
    rows = np.array([5, 5, 0, 299])
    n = int((x.indptr[rows + 1] - x.indptr[rows]).sum())
    out_i, out_d = np.empty(n, x.indices.dtype), np.empty(n, x.data.dtype)
    crow, cols, vals = kernels.row_gather(
        x.indptr, x.indices, x.data, rows, out_i, out_d, n_cols=57
    )
    assert cols is out_i and vals is out_d
    np.testing.assert_array_equal(
        sp.csr_matrix((vals, cols, crow), shape=(4, 57)).toarray(), x[rows].toarray()
    )


def test_densify_into_a_buffer_holding_old_bytes(path: str) -> None:
    """``zeroed=False`` (a reused ring slot): every row is zeroed before it is filled, in blocks or
    not."""
    x = _matrix(4)
    for m in (1, kernels.ZERO_BLOCK_ROWS, 2 * kernels.ZERO_BLOCK_ROWS + 5):
        sub = x[:m]
        out = np.full(m * 57, 7.0, np.float32)
        got = kernels.densify(sub.indptr, sub.indices, sub.data, 57, out, zeroed=False)
        np.testing.assert_array_equal(got, sub.toarray())


def test_densify_matches_toarray_with_and_without_out(path: str) -> None:
    x = _matrix(3)
    np.testing.assert_array_equal(kernels.densify(x.indptr, x.indices, x.data, 57), x.toarray())
    out = np.zeros(x.shape[0] * 57, np.float32)
    kernels.densify(x.indptr, x.indices, x.data.astype(np.float64), 57, out)
    np.testing.assert_array_equal(out.reshape(x.shape), x.toarray())


def test_a_broken_scipy_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels.use_fallback(True)
    try:

        def broken(*a: object, **k: object) -> None:
            raise TypeError("no csr here")

        monkeypatch.setattr(sp, "csr_matrix", broken)
        x = _matrix()
        with pytest.raises(kernels.KernelError, match="reinstall scipy"):
            kernels.row_gather(x.indptr, x.indices, x.data, np.array([1, 2]))
        with pytest.raises(kernels.KernelError, match="reinstall scipy"):
            kernels.densify(x.indptr, x.indices, x.data, 57)
    finally:
        kernels.use_fallback(False)


def test_loader_batches_are_equal_on_both_paths(
    tmp_path: Path, build_dataset: Callable[..., Any]
) -> None:
    from loaders import ShardDataset

    fx = build_dataset(tmp_path / "ds", "shards")
    runs = []
    for fallback in (False, True):
        kernels.use_fallback(fallback)
        try:
            for sample in ("cells", "pairs", "sentences"):
                ds = ShardDataset(
                    fx.root, sample=sample, batch_size=16, seed=4, decode_process=False
                )
                ds.set_epoch(1)
                runs.append([{k: v.numpy().copy() for k, v in b.items()} for b in ds])
        finally:
            kernels.use_fallback(False)
    for a, b in zip(runs[:3], runs[3:], strict=True):
        assert len(a) == len(b) > 0
        for x, y in zip(a, b, strict=True):
            assert x.keys() == y.keys()
            for k in x:
                np.testing.assert_array_equal(x[k], y[k])


def test_scattered_rows_finish_like_csr_rows_in_numpy_and_torch() -> None:
    """CSR rows shipped to a device as flat positions (loaders.samples.payload.Scattered) densify to the
    same batch as the CSR parts, with the numpy finisher (also into a buffer holding old bytes)
    and the torch one."""
    import torch

    from loaders.engine.device import TORCH_OPS
    from loaders.modalities.perturbation.ops import SCATTER_OP, Gathered

    x = _matrix(3)
    rows = np.array([5, 7, 0, 299, 5, 120])  # repeated and empty rows too
    crow, cols, vals = kernels.row_gather(x.indptr, x.indices, x.data, rows)
    g = Gathered(crow, cols, vals, (2, 3, x.shape[1]))
    want = x[rows].toarray().reshape(2, 3, -1)
    s = g.for_device()
    assert s.op == SCATTER_OP and s.pos.dtype == np.int64 and s.vals.dtype == np.float32
    np.testing.assert_array_equal(
        s.pos, np.flatnonzero(x[rows].toarray())
    )  # canonical rows: sorted, no zeros
    np.testing.assert_array_equal(g.finish(), want)
    np.testing.assert_array_equal(s.finish(), want)
    stale = np.full(want.size, 7.0, np.float32)
    np.testing.assert_array_equal(s.finish(out=stale, zeroed=False), want)
    parts = {k: torch.from_numpy(v) for k, v in s.parts().items()}
    np.testing.assert_array_equal(TORCH_OPS[SCATTER_OP](parts, s.meta()).numpy(), want)
