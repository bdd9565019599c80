"""Barcodes read from the file's bytes (h5vlen) are h5py's, byte for byte, or not read that way."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from pipeline.modalities.perturbation import h5vlen
from pipeline.modalities.perturbation.obs_names import ObsNames, read_obs_names

VLEN = h5py.string_dtype("utf-8")


def _h5py_names(ds: h5py.Dataset) -> ObsNames:
    return ObsNames.from_values(ds[:])


def _same(raw: tuple[np.ndarray, np.ndarray] | None, ds: h5py.Dataset) -> None:
    assert raw is not None
    want = _h5py_names(ds)
    np.testing.assert_array_equal(raw[0], want.offsets)
    np.testing.assert_array_equal(raw[1], want.data)


def _names(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    alphabet = list("ACGTacgt-_0123456789") + ["é", "ß", "漢", "🧬"]
    return [
        f"{i}:" + "".join(rng.choice(alphabet, int(rng.integers(0, 30))).tolist()) for i in range(n)
    ]


def test_anndata_obs_index(tmp_path: Path) -> None:
    ad = pytest.importorskip("anndata")
    names = _names(5000, 0)
    names[17] = "x" * 70_000  # bigger than a default heap collection
    a = ad.AnnData(np.zeros((len(names), 2), np.float32))
    a.obs_names = names
    a.obs["c"] = np.array(["u", "v"] * (len(names) // 2))
    a.write_h5ad(tmp_path / "a.h5ad")
    with h5py.File(tmp_path / "a.h5ad") as f:
        _same(h5vlen.read_vlen_strings(f["obs/_index"]), f["obs/_index"])
        got = read_obs_names(f["obs"], len(names), tmp_path / "a.h5ad")
    bounds = zip(got.offsets[:-1], got.offsets[1:], strict=True)
    assert [got.data[a:b].tobytes().decode() for a, b in bounds] == names


def test_collections_shared_with_other_strings_are_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names written one at a time between another dataset's strings: their collections hold
    objects the names do not reference, so the predicted layout fails and they are walked."""
    walked = []
    walk = h5vlen._walk
    monkeypatch.setattr(h5vlen, "_walk", lambda *a: walked.append(a) or walk(*a))
    names, other = _names(3000, 1), _names(3000, 2)
    with h5py.File(tmp_path / "i.h5", "w") as f:
        a = f.create_dataset("a", (len(names),), VLEN)
        b = f.create_dataset("b", (len(other),), VLEN)
        for i in range(len(names)):
            a[i] = names[i]
            b[i] = other[i]
    with h5py.File(tmp_path / "i.h5") as f:
        _same(h5vlen.read_vlen_strings(f["a"]), f["a"])
        _same(h5vlen.read_vlen_strings(f["b"]), f["b"])
    assert walked


@pytest.mark.parametrize(
    "kind", ["chunked", "gzip", "fixed", "empty string", "empty dataset", "2-d"]
)
def test_other_layouts_are_left_to_h5py(tmp_path: Path, kind: str) -> None:
    names = _names(500, 3)
    with h5py.File(tmp_path / "o.h5", "w") as f:
        obs = f.create_group("obs")
        obs.attrs["_index"] = "_index"
        if kind == "chunked":
            obs.create_dataset("_index", data=names, dtype=VLEN, chunks=(64,))
        elif kind == "gzip":
            obs.create_dataset("_index", data=names, dtype=VLEN, compression="gzip")
        elif kind == "fixed":
            obs.create_dataset("_index", data=np.array([n.encode() for n in names]))
        elif kind == "empty string":
            obs.create_dataset("_index", data=[*names[:9], "", *names[10:]], dtype=VLEN)
        elif kind == "empty dataset":
            names = []
            obs.create_dataset("_index", (0,), VLEN)
        else:
            obs.create_dataset("_index", data=np.array(names, object).reshape(50, 10), dtype=VLEN)
    with h5py.File(tmp_path / "o.h5") as f:
        ds = f["obs/_index"]
        assert h5vlen.read_vlen_strings(ds) is None
        if ds.ndim == 1:
            got = read_obs_names(f["obs"], ds.shape[0], tmp_path / "o.h5")
            want = _h5py_names(ds)
            np.testing.assert_array_equal(got.offsets, want.offsets)
            np.testing.assert_array_equal(got.data, want.data)


def test_a_damaged_heap_is_left_to_h5py(tmp_path: Path) -> None:
    """A collection signature that is not "GCOL": no guessing, h5py decides (here: it fails)."""
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("a", data=_names(100, 4), dtype=VLEN)
    with h5py.File(path) as f:
        offset = f["a"].id.get_offset()
    el = np.fromfile(path, h5vlen.ELEMENT, 1, offset=offset)
    with open(path, "r+b") as fh:
        fh.seek(int(el["addr"][0]))
        fh.write(b"XCOL")
    with h5py.File(path) as f:
        assert h5vlen.read_vlen_strings(f["a"]) is None
