"""The plan's compact paths give what the straightforward ones give: the condition table counted in a
presence table equals np.unique's (rows, order and inverse)."""

from __future__ import annotations

import numpy as np
import pytest

import pipeline.plan.conditions as conditions


@pytest.mark.parametrize("sizes", [(7, 3, 5), (1,), (300, 2, 9, 4)])
def test_distinct_rows_dense_equals_the_sort(sizes: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(len(sizes))
    cols = [rng.integers(0, s, 5000).astype(np.int32) for s in sizes]
    inverse, table = conditions.distinct_rows(cols)
    monkeypatch.setattr(conditions, "DENSE_KEYS", 0)  # force the np.unique path
    inverse_sorted, table_sorted = conditions.distinct_rows(cols)
    assert np.array_equal(table, table_sorted) and np.array_equal(inverse, inverse_sorted)
    assert inverse.dtype == np.int32 and table.dtype == np.int32
    assert np.array_equal(table[inverse], np.stack(cols, axis=1))
