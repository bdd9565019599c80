"""The source checks: their cheap forms find what the full ones find (value checks on min/max and in
steps), and validate_* on raw parts. (The scan checking barcodes without reading them is tested
per source flavour in test_sources_bad_input.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from pipeline.errors import SourceError
from pipeline.modalities.perturbation import validate
from pipeline.modalities.perturbation.validate import CsrParts, validate_block, validate_dense


@pytest.mark.parametrize("at", [0, 5, validate.SCAN - 1, validate.SCAN, 3 * validate.SCAN + 17])
def test_value_checks_find_the_first_bad_entry_in_any_step(at: int) -> None:
    """The value checks run on min/max and in SCAN-sized steps: the first bad entry is found
    wherever it is."""
    data = np.arange(4 * validate.SCAN, dtype=np.float32) % 7
    assert validate._check_values(data, counts=True) is None
    for value, problem in (
        (0.5, "non-integer value (0.5)"),
        (-2.0, "negative value (-2.0)"),
        (np.inf, "NaN or inf value (inf)"),
        (np.nan, "NaN or inf value (nan)"),
    ):
        bad = data.copy()
        bad[at] = value
        bad[-1] = value  # a later one too: the first is named
        got = validate._check_values(bad, counts=True)
        assert got is not None and got[0] == at and got[1].startswith(problem)
    assert (
        validate._check_values(
            np.where(np.arange(data.size) == at, 0.5, data).astype(np.float32), False
        )
        is None
    )


# --- validate_* on raw parts --------------------------------------------------------------------


def test_validate_block_accepts_parts_and_matrices() -> None:
    x = sp.random(30, 12, density=0.3, format="csr", dtype=np.float32, random_state=0)
    x.data = np.ceil(x.data * 9)  # counts are whole numbers
    validate_block(x, "m.h5", 0, counts=True)
    validate_block((x.data, x.indices, x.indptr, 12), "m.h5", 0, counts=True)
    bad = CsrParts(x.data.copy(), x.indices.copy(), x.indptr.copy(), 12)
    bad.indices[int(x.indptr[20])] = -1
    with pytest.raises(
        SourceError, match=r"^m\.h5: row 1020: column index -1 out of range \[0, 12\)"
    ):
        validate_block(bad, "m.h5", 1000, counts=False)
    with pytest.raises(SourceError, match="indices length"):
        validate_block((x.data, x.indices[:-1], x.indptr, 12), "m.h5", 0, counts=False)


def test_validate_dense() -> None:
    block = np.zeros((6, 4), dtype=np.float32)
    validate_dense(block, "d.h5", 0, counts=True, n_cols=4)
    with pytest.raises(SourceError, match="expected 5"):
        validate_dense(block, "d.h5", 0, counts=False, n_cols=5)
    block[4, 2] = np.nan
    with pytest.raises(SourceError, match="row 14: NaN or inf"):
        validate_dense(block, "d.h5", 10, counts=False)
