"""A piece's column-index range (the format's range check) from each row's first and last entry
equals the range over every entry, for sorted rows, empty rows and all-empty pieces; unsorted rows
take the full pass."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from pipeline.modalities.perturbation.routing import index_range


def test_the_row_ends_give_the_full_range() -> None:
    rng = np.random.default_rng(3)
    for density in (0.0, 0.01, 0.3):
        m = sp.random(300, 500, density=density, format="csr", random_state=rng)
        m.sum_duplicates()  # canonical: sorted columns within each row
        lengths = np.diff(m.indptr).astype(np.int64)
        got = index_range(m.indices, lengths, True)
        want = [m.indices.min(), m.indices.max()] if m.nnz else []
        assert got.dtype == np.int64 and got.tolist() == list(want)


def test_unsorted_rows_take_the_full_pass() -> None:
    indices = np.array([2, 9, 7, 4, 1], np.int32)  # rows [2, 9, 7] and [4, 1]: both unsorted
    lengths = np.array([3, 2], np.int64)
    assert index_range(indices, lengths, False).tolist() == [1, 9]
    assert index_range(indices, lengths, True).tolist() != [1, 9]  # why the flag matters
