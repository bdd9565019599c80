"""The cheap forms of the source checks find what the full ones find: value checks on min/max and in steps,
barcodes checked by the scan without reading them."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from pipeline.modalities.perturbation.matrix import open_source
from pipeline.modalities.perturbation import validate
from tests.test_sources import FLAVOURS, _csr_file, _raises


@pytest.mark.parametrize("at", [0, 5, validate.SCAN - 1, validate.SCAN, 3 * validate.SCAN + 17])
def test_value_checks_find_the_first_bad_entry_in_any_step(at: int) -> None:
    """The value checks run on min/max and in SCAN-sized steps: the first bad entry is found wherever it is."""
    data = np.arange(4 * validate.SCAN, dtype=np.float32) % 7
    assert validate._check_values(data, counts=True) is None
    for value, problem in ((0.5, "non-integer value (0.5)"), (-2.0, "negative value (-2.0)"),
                           (np.inf, "NaN or inf value (inf)"), (np.nan, "NaN or inf value (nan)")):
        bad = data.copy()
        bad[at] = value
        bad[-1] = value  # a later one too: the first is named
        got = validate._check_values(bad, counts=True)
        assert got is not None and got[0] == at and got[1].startswith(problem)
    assert validate._check_values(np.where(np.arange(data.size) == at, 0.5, data).astype(np.float32), False) is None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_scan_checks_barcodes_without_reading_them(tmp_path: Path, flavour: str) -> None:
    """meta(names=False) (the scan) keeps no barcodes but says the source has them, and refuses an obs index
    of the wrong length as meta() does; the names the plan reads later are meta()'s."""
    path, x, kind = _csr_file(tmp_path, flavour)
    src = open_source(kind, path)
    lean, full = src.meta([], names=False), src.meta([])
    assert lean.obs_names is None and lean.has_obs_names and full.obs_names is not None
    got = src.read_obs_names(x.shape[0])
    assert got is not None and np.array_equal(got.data, full.obs_names.data)
    src.close()
    if flavour == "legacy":  # a compound obs table: its index cannot be shorter than its rows
        return
    with h5py.File(path, "r+") as f:
        key = f["obs"].attrs.get("_index", "_index")
        key = key.decode() if isinstance(key, bytes) else str(key)
        names = f["obs"][key][:-1]
        del f["obs"][key]
        f["obs"].create_dataset(key, data=names, dtype=h5py.string_dtype())
    src = open_source(kind, path)
    for names_too in (False, True):
        _raises(lambda n=names_too: src.meta([], names=n), path, f"obs index has {x.shape[0] - 1} names")
