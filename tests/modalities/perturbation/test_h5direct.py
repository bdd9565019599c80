"""Uncompressed HDF5 slices read by pread (pipeline.modalities.perturbation.h5direct) equal h5py's,
for every storage it reads directly; every storage it must not read (filters, unwritten chunks,
a user block) goes through h5py; a file cut short under the reader is an error naming it."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from pipeline.modalities.perturbation.h5direct import DirectSlices, extent_of

N = 10_007  # not a multiple of any chunk: the last chunk is partly used


def _write(path: Path) -> None:
    rng = np.random.default_rng(0)
    a = rng.random(N).astype("<f4")
    with h5py.File(path, "w") as f:
        f["contiguous"] = a
        f.create_dataset("chunked", data=a, chunks=(1000,))
        f.create_dataset("big_endian", data=rng.integers(0, 999, N).astype(">i4"), chunks=(777,))
        f.create_dataset("float64", data=a.astype(np.float64), chunks=(512,))
        f.create_dataset("gzip", data=a, chunks=(1000,), compression="gzip")
        f.create_dataset("shuffled", data=a, chunks=(1000,), shuffle=True)
        f.create_dataset("fletcher", data=a, chunks=(1000,), fletcher32=True)
        f.create_dataset("unwritten_chunks", shape=(N,), dtype="f4", chunks=(1000,))
        f["unwritten_chunks"][:2500] = a[:2500]
        f.create_dataset("never_written", shape=(50,), dtype="f4")
        f.create_dataset("empty", shape=(0,), dtype="f4")


DIRECT = ["contiguous", "chunked", "big_endian", "float64"]
THROUGH_H5PY = ["gzip", "shuffled", "fletcher", "unwritten_chunks", "never_written", "empty"]
RANGES = [(0, N), (0, 0), (999, 1001), (1000, 2000), (N // 3, N // 2), (N - 7, N)]


@pytest.mark.parametrize("name", DIRECT + THROUGH_H5PY)
def test_slices_equal_h5py(name: str, tmp_path: Path) -> None:
    _write(tmp_path / "t.h5")
    reader = DirectSlices(tmp_path / "t.h5")
    with h5py.File(tmp_path / "t.h5", "r") as f:
        dset = f[name]
        assert (extent_of(dset) is not None) == (name in DIRECT)
        for lo, hi in RANGES:
            lo, hi = min(lo, dset.shape[0]), min(hi, dset.shape[0])
            got, want = reader.read(dset, lo, hi), dset[lo:hi]
            assert got.dtype == want.dtype and np.array_equal(got, want), (lo, hi)
    reader.close()


def test_a_user_block_goes_through_h5py(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "u.h5", "w", userblock_size=512) as f:
        f["x"] = np.arange(100, dtype=np.float32)
    with h5py.File(tmp_path / "u.h5", "r") as f:
        assert extent_of(f["x"]) is None
        assert np.array_equal(DirectSlices(tmp_path / "u.h5").read(f["x"], 3, 9), f["x"][3:9])


def test_a_file_cut_short_under_the_reader_is_an_error(tmp_path: Path) -> None:
    """The layout was read, then the file lost its tail (a copy still being written, a full
    disk): the read fails (the source turns it into a SourceError naming the file), where h5py's
    default driver would hand back zeros for the missing bytes."""
    _write(tmp_path / "t.h5")
    reader = DirectSlices(tmp_path / "t.h5")
    with h5py.File(tmp_path / "t.h5", "r") as f:
        dset = f["chunked"]
        assert reader.read(dset, 0, 10).size == 10  # the extent is known now
        end = int(extent_of(dset).starts[-2])  # the last full chunk
        os.truncate(tmp_path / "t.h5", end + 100)
        with pytest.raises(OSError, match="short read: 100 of 4000 bytes of /chunked"):
            reader.read(dset, 0, N)
    reader.close()
