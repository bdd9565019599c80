"""loaders.samples.gather: the per-layout gathers give what plain per-row Python indexing gives, for rows in
one arena or spread over several (a batch straddling windows), on both branches of the ragged
gather."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.samples import gather
from loaders.samples.arena import Arena
from loaders.samples.gather import Rows, ragged_rows


def _reference(
    offsets: np.ndarray, values: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    parts = [values[offsets[r] : offsets[r + 1]] for r in rows.tolist()]
    out = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return out, (np.concatenate(parts) if parts else values[:0])


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 400), min_size=1, max_size=12), data=st.data())
def test_ragged_rows_match_per_row_slicing(lengths: list[int], data: st.DataObject) -> None:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = np.arange(int(offsets[-1]) * 3, dtype=np.int32).reshape(-1, 3)
    rows = np.array(data.draw(st.lists(st.integers(0, len(lengths) - 1), max_size=8)), np.int64)
    got, want = ragged_rows(offsets, values, rows), _reference(offsets, values, rows)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1].dtype == values.dtype and got[1].shape[1:] == (3,)
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize(
    "length", [3, gather.SLICE_MIN_MEAN * 4]
)  # the element-index and the slice branches
def test_both_ragged_branches_give_the_same_lists(length: int) -> None:
    offsets = np.arange(0, 10 * length + 1, length, dtype=np.int64)
    values = np.random.default_rng(0).integers(0, 1000, (10 * length, 2)).astype(np.uint16)
    rows = np.array([7, 0, 7, 9], np.int64)
    got, want = ragged_rows(offsets, values, rows), _reference(offsets, values, rows)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def _arena(seed: int, n: int) -> tuple[Arena, sp.csr_matrix, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = sp.random(n, 9, density=0.3, format="csr", dtype=np.float32, random_state=seed)
    lists = [rng.integers(0, 50, int(k)).astype(np.int32) for k in rng.integers(0, 5, n)]
    off = np.concatenate([[0], np.cumsum([len(t) for t in lists])]).astype(np.int64)
    columns = {
        "X/indptr": x.indptr.astype(np.int64),
        "X/indices": x.indices.astype(np.int32),
        "X/data": x.data,
        "code": rng.integers(0, 7, n).astype(np.int16),
        "id": np.arange(n, dtype=np.int64) + 1000 * seed,
        "emb": rng.normal(size=(n, 2)).astype(np.float32),
        "tok/offsets": off,
        "tok/values": np.concatenate(lists) if lists else np.zeros(0, np.int32),
    }
    layouts = {
        "X": ["csr", "float32", [9]],
        "code": ["dense", "int16", []],
        "id": ["dense", "int64", []],
        "emb": ["dense", "float32", [2]],
        "tok": ["ragged", "int32", []],
    }
    return Arena(np.array([seed]), np.array([0, n]), columns, layouts), x, lists


@pytest.mark.parametrize("split", [False, True])
def test_rows_over_one_or_two_arenas(split: bool) -> None:
    (a0, x0, l0), (a1, x1, l1) = _arena(0, 13), _arena(1, 8)
    group = np.array([0, 1, 1, 0, 0, 1, 0]) if split else np.zeros(7, np.int64)
    rows = np.array([12, 0, 7, 0, 5, 3, 12])
    rows = np.where(group == 1, rows % 8, rows)
    rs = Rows([a0, a1], group, rows) if split else Rows([a0], None, rows)
    pick = [
        ((x0, l0, a0) if g == 0 else (x1, l1, a1), r)
        for g, r in zip(group.tolist(), rows.tolist(), strict=True)
    ]
    np.testing.assert_array_equal(
        rs.take("emb"), np.stack([a.columns["emb"][r] for (_, _, a), r in pick])
    )
    ints = rs.ints(["id", "code"])
    assert ints.dtype == np.int64 and ints.shape == (2, 7)
    np.testing.assert_array_equal(ints[0], [a.columns["id"][r] for (_, _, a), r in pick])
    np.testing.assert_array_equal(ints[1], [a.columns["code"][r] for (_, _, a), r in pick])
    dense = rs.csr("X", (7, 9)).finish()
    np.testing.assert_array_equal(dense, np.stack([x[r].toarray()[0] for (x, _, _), r in pick]))
    rag = rs.ragged("tok")
    want = [lst[r] for (_, lst, _), r in pick]
    np.testing.assert_array_equal(np.diff(rag.offsets), [len(t) for t in want])
    np.testing.assert_array_equal(rag.values, np.concatenate(want))
