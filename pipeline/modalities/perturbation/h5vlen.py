"""A 1-D dataset of variable-length strings (an h5ad obs index) read from the file's bytes.

Why: h5py turns every vlen string into a Python bytes object, and HDF5 looks each one up in the
global heap on its own: ~0.3 us a name, 0.75 CPU-s of a 2M-cell plan. The on-disk layout is
simple (HDF5 file format spec, "Global Heap" and "Variable-Length Data"): the dataset's contiguous
storage holds one (length u32, heap collection address u64, object index u32) per element; a
collection is "GCOL", version 1, its size, then objects back to back (in index order when they
were written in one go), each a 16-byte header (index u16, reference count u16, reserved u32, size
u64) and its bytes padded to 8. Here every element's object is located with array arithmetic and
its header checked (index and size); a collection whose layout does not match is walked object by
object. Anything else (chunked or
filtered storage, other drivers, a userblock, 4-byte addresses, empty strings, a NUL inside a
string) returns None and the caller reads through h5py, so the names are always h5py's bytes.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from pipeline.modalities.perturbation.h5direct import raw_file

if TYPE_CHECKING:
    import h5py

ELEMENT = np.dtype([("len", "<u4"), ("addr", "<u8"), ("idx", "<u4")])
HEADER = 16  # bytes of a collection header and of an object header
CHUNK = 1 << 16  # names gathered per step: the byte gather's int64 index is 8 bytes a name byte


def _plain_vlen(ds: h5py.Dataset) -> int | None:
    """The dataset's file offset when its elements are plain heap IDs this module can follow."""
    import h5py  # import weight: the plan imports this module (via obs_names)

    f = ds.file
    info = h5py.check_string_dtype(ds.dtype)
    tid = ds.id.get_type()
    if (
        ds.ndim != 1
        or info is None
        or info.length is not None
        or not isinstance(tid, h5py.h5t.TypeStringID)
        or not tid.is_variable_str()
        or tid.get_strpad() != h5py.h5t.STR_NULLTERM
        or ds.id.get_create_plist().get_layout() != h5py.h5d.CONTIGUOUS
        or ds.external
        or not raw_file(f)
        or f.id.get_create_plist().get_sizes() != (8, 8)
    ):
        return None
    return ds.id.get_offset()


def _collections(fd: int, addrs: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(heap bytes of these collections back to back, each padded to 8 bytes so that every object
    header is a pair of aligned words, and the [start, end) of each), or None when one is not a
    version-1 collection or they exceed `budget` bytes."""
    parts, sizes, total = [], [], 0
    for a in addrs.tolist():
        head = os.pread(fd, HEADER, a)
        if len(head) < HEADER or head[:5] != b"GCOL\x01":
            return None
        size = int.from_bytes(head[8:16], "little")
        total += size
        if size < HEADER or total > budget:
            return None
        sizes.append(size)
        body = os.pread(fd, size, a)
        if len(body) != size:
            return None
        parts.append(body + bytes(-size % 8))
    bounds = np.zeros((len(parts), 2), np.int64)
    bounds[1:, 0] = np.cumsum([len(p) for p in parts[:-1]])
    bounds[:, 1] = bounds[:, 0] + sizes
    return np.frombuffer(b"".join(parts), np.uint8), bounds


def _walk(heap: np.ndarray, lo: int, hi: int) -> dict[int, tuple[int, int]]:
    """index -> (position, size) of every object of one collection, in storage order."""
    out, pos = {}, lo + HEADER
    while pos + HEADER <= hi:
        head = heap[pos : pos + HEADER]
        index = int(head[:2].view("<u2")[0])
        size = int(head[8:].view("<u8")[0])
        if index == 0 or pos + HEADER + size > hi:  # the free space (the last object), or the end
            break
        out[index] = (pos, size)
        pos += HEADER + (size + 7) // 8 * 8
    return out


def _locate(
    heap: np.ndarray, bounds: np.ndarray, cid: np.ndarray, idx: np.ndarray, lens: np.ndarray
) -> np.ndarray | None:
    """Each element's object header position in `heap`: predicted from the objects this dataset
    references (a collection's objects lie in index order), checked against the headers there
    (index and size); collections that fail the check are walked. A collection whose objects all
    check is laid out as predicted: its first object starts right after its header, and each
    checked size places the next."""
    width = int(idx.max()) + 1
    if bounds.shape[0] * width > 4 * idx.size + (1 << 16):
        return None
    span = np.zeros((bounds.shape[0], width), np.int64)
    span[cid, idx] = HEADER + (lens + 7) // 8 * 8
    before = np.cumsum(span, axis=1)
    before -= span
    pos = bounds[cid, 0] + HEADER + before[cid, idx]
    ok = pos + HEADER + lens <= bounds[cid, 1]
    words = heap.view("<u8")  # every header is 8-aligned (see _collections)
    at = np.where(ok, pos, 0) // 8
    ok &= (words[at] & 0xFFFF) == idx.astype(np.uint64)
    ok &= words[at + 1] == lens.astype(np.uint64)
    for c in np.unique(cid[~ok]).tolist():
        objects = _walk(heap, int(bounds[c, 0]), int(bounds[c, 1]))
        for e in np.flatnonzero(cid == c).tolist():
            found = objects.get(int(idx[e]))
            if found is None or found[1] != int(lens[e]):
                return None
            pos[e] = found[0]
    return pos


def read_vlen_strings(ds: h5py.Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """(offsets int64 [n + 1], UTF-8 bytes uint8) of the strings, as h5py reads them; None when
    the dataset is not one this module reads (see the module docstring)."""
    offset = _plain_vlen(ds)
    n = int(ds.shape[0])
    if offset is None or n == 0:
        return None
    fd = os.open(ds.file.filename, os.O_RDONLY)
    try:
        raw = os.pread(fd, n * ELEMENT.itemsize, offset)
        if len(raw) != n * ELEMENT.itemsize:
            return None
        el = np.frombuffer(raw, ELEMENT)
        lens = el["len"].astype(np.int64)
        if int(lens.min()) == 0:  # an empty string or a null: h5py's own reading decides
            return None
        addr = el["addr"]
        runs = np.r_[0, np.flatnonzero(addr[1:] != addr[:-1]) + 1]
        heaps = np.unique(addr[runs])
        cid = np.repeat(np.searchsorted(heaps, addr[runs]), np.diff(np.r_[runs, n]))
        budget = 8 * (n * (HEADER + 8) + int(lens.sum())) + (1 << 20)
        found = _collections(fd, heaps, budget)
    finally:
        os.close(fd)
    if found is None:
        return None
    heap, bounds = found
    pos = _locate(heap, bounds, cid, el["idx"].astype(np.int64), lens)
    if pos is None:
        return None
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    for a in range(0, n, CHUNK):
        b = min(a + CHUNK, n)
        lo, hi = int(offsets[a]), int(offsets[b])
        shift = np.repeat(pos[a:b] + HEADER - offsets[a:b], lens[a:b])
        data[lo:hi] = heap[shift + np.arange(lo, hi)]
    if not data.all():  # a NUL ends a C string: h5py would cut the name there
        return None
    return offsets, data
