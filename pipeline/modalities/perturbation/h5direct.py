"""Slices of uncompressed one-dimensional HDF5 datasets read straight from the file, at the byte
offsets HDF5 reports for their storage, instead of through h5py.

Why: h5py runs every call under one process-wide lock, so the build's read tasks, which read
their sources' ``data`` and ``indices`` in blocks on several threads, read one at a time; and its
per-chunk path costs more than the copy. ``os.preadv`` into the block's own buffer releases the
GIL and needs no lock. Reading the 200k-cell screen's source in 16,384-row blocks on 2 threads
took 0.16-0.34 s of wall through h5py and 0.06-0.08 s this way (a throwaway timing;
docs/PIPELINE.md, "the plan at half its CPU, reads without h5py's lock").

Only where the bytes in the file are the values: a 1-d numeric dataset with no filters
(compression, shuffle, checksums), no external or virtual storage, allocated storage (contiguous,
or chunks that all exist at full size), in a file without a user block. Anything else, and any
doubt, is read by h5py as before: the result is the same array either way (tests compare them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.buffers import STAGE, Scratch
from pipeline.lazy import LazyModule

if TYPE_CHECKING:
    import h5py
else:  # imported on first use (pipeline.lazy)
    h5py = LazyModule("h5py")


@dataclass(frozen=True)
class Extent:
    """Where a dataset's values lie: `starts[k]` is the file offset of values
    [k * run, (k + 1) * run) (one run for contiguous storage)."""

    dtype: np.dtype
    run: int
    starts: np.ndarray


def raw_file(f: Any) -> bool:
    """Whether offsets HDF5 reports in `f` are offsets in the file on disk: the default (or stdio)
    driver, no user block. The rule every read from the file's own bytes follows (here and
    `h5vlen`)."""
    return f.userblock_size == 0 and f.driver in ("sec2", "stdio")


def extent_of(dset: Any) -> Extent | None:
    """The dataset's storage as plain byte runs, or None where h5py must read it."""
    try:
        if dset.ndim != 1 or dset.dtype.kind not in "iuf" or dset.is_virtual:
            return None
        if not raw_file(dset.file):
            return None
        plist = dset.id.get_create_plist()
        if plist.get_nfilters() != 0 or plist.get_external_count() != 0:
            return None
        n, itemsize = int(dset.shape[0]), dset.dtype.itemsize
        layout = plist.get_layout()
        if layout == h5py.h5d.CONTIGUOUS:
            offset = dset.id.get_offset()
            if offset is None:  # never written: HDF5 serves the fill value
                return None
            return Extent(dset.dtype, max(n, 1), np.array([offset], np.int64))
        if layout != h5py.h5d.CHUNKED or not hasattr(dset.id, "chunk_iter"):
            return None
        run = int(dset.chunks[0])
        found: list[tuple[int, int, int]] = []
        dset.id.chunk_iter(
            lambda info: found.append((info.chunk_offset[0], info.byte_offset, info.size))
        )
        found.sort()
        if len(found) != -(-n // run):
            return None  # a chunk never written: HDF5 serves the fill value for it
        firsts = np.array([f[0] for f in found], np.int64)
        sizes = np.array([f[2] for f in found], np.int64)
        if not (
            np.array_equal(firsts, np.arange(len(found)) * run) and (sizes == run * itemsize).all()
        ):
            return None
        return Extent(dset.dtype, run, np.array([f[1] for f in found], np.int64))
    except (AttributeError, TypeError, ValueError, RuntimeError, OSError):
        return None  # an HDF5 or h5py without these calls: read through h5py


class DirectSlices:
    """`read(dset, lo, hi)` = ``dset[lo:hi]``, by pread where `extent_of` allows. One file
    descriptor per process (reopened after a fork); `close` when the source closes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid: int | None = None
        self._extents: dict[str, Extent | None] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_fd": None, "_pid": None, "_extents": {}}

    def _handle(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        return self._fd

    def read(self, dset: Any, lo: int, hi: int, into: Scratch | None = None) -> np.ndarray:
        """Values [lo, hi) of a 1-D dataset; with `into`, in its buffer for the dataset's column
        (a view, valid until the next read of that column: pipeline.buffers)."""
        name = dset.name
        if name not in self._extents:
            self._extents[name] = extent_of(dset)
        ext = self._extents[name]
        if ext is None or not 0 <= lo <= hi <= dset.shape[0]:
            return dset[lo:hi]
        out = (
            np.empty(hi - lo, ext.dtype)
            if into is None
            else into.get(STAGE + name.rsplit("/", 1)[-1], ext.dtype, hi - lo)
        )
        view, size, fd = memoryview(out).cast("B"), ext.dtype.itemsize, self._handle()
        pos = lo
        while pos < hi:
            k = pos // ext.run
            end = min(hi, (k + 1) * ext.run)
            want = (end - pos) * size
            got = os.preadv(
                fd,
                [view[(pos - lo) * size : (end - lo) * size]],
                int(ext.starts[k]) + (pos - k * ext.run) * size,
            )
            if got != want:  # the file shrank under the reader
                raise OSError(f"short read: {got} of {want} bytes of {name} at value {pos}")
            pos = end
        return out

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd, self._pid = None, None
