"""A shard's rows between the read of its source and its pack, and their way back in planned order.

The read delivers a shard's rows in pieces (one per source block), each sorted by planned
position; the pieces live in memory (small sources) or in append-only spill files. `ShardRows`
presents them as the shard's columns in planned order without ever assembling a whole shard: a
chunk of final rows is fetched from every piece (a contiguous range in each, because pieces are
sorted) and put in order with one small row gather. Pack memory is then a few chunks, not two
copies of the shard.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loaders import format as fmt
from loaders.samples import kernels
from pipeline.buffers import GATHERED, STAGE, thread_scratch

ENTRY_ARRAYS = {
    "data": np.dtype(np.float32),
    "indices": np.dtype(np.int32),
}  # one value per stored entry
GATHERED_NAMES = [GATHERED + name for name in ENTRY_ARRAYS]  # a chunk's gathered entry arrays
ROW_ARRAYS = {"lengths": np.dtype(np.int64), "pos": np.dtype(np.int64)}  # one value per row
OBSM = "obsm~"  # obsm~<key>: float32 rows of an embedding
# int64 (min, max) of each delivered piece's column indices, for the format's range check
RANGE = "irange"
# Column indices spilled as uint16, where every index of the file fits (a matrix of at most
# 65,536 columns: scPerturb's and STATE's gene spaces do). Why: the spill is written to fresh
# page-cache pages, the dearest bytes a build writes on a VM that returns free memory to its host
# (docs/benchmarks/ANALYSIS.md, 26.3b); a quarter fewer of them. Read back, they are widened into the
# int32 stage the gather takes.
NARROW = "indices16"
NARROW_LIMIT = 1 << 16  # column indices below this fit NARROW


@dataclass
class Piece:
    """Rows sorted by planned position; `read(name, start, stop, out)` copies entries [start, stop)
    of an entry array, or rows [start, stop) of an obsm array, into `out`."""

    pos: np.ndarray
    lengths: np.ndarray
    read: Callable[[str, int, int, np.ndarray], None]

    def __post_init__(self) -> None:
        self.starts = np.zeros(self.pos.size + 1, np.int64)
        np.cumsum(self.lengths, out=self.starts[1:])

    def fetch(self, name: str, a: int, b: int, shape: tuple[int, ...] = ()) -> np.ndarray:
        out = np.empty((b - a, *shape), ENTRY_ARRAYS.get(name, np.dtype(np.float32)))
        self.read(name, a, b, out)
        return out


def memory_piece(arrays: Mapping[str, np.ndarray]) -> Piece:
    def read(name: str, a: int, b: int, out: np.ndarray) -> None:
        out[...] = arrays[name][a:b]

    return Piece(arrays["pos"], arrays["lengths"], read)


def parked_bytes(segs: Sequence[Mapping[str, np.ndarray]]) -> int:
    """Bytes a shard's pieces hold in memory (`pipeline.parking`'s budget counts them)."""
    return sum(a.nbytes for seg in segs for a in seg.values())


class OpenFiles:
    """Spill files opened once for all the reads of one pack task (a shard's chunks read each
    piece's range of every file: ~10,000 open/close pairs per million cells otherwise); `close`
    when the task is done."""

    def __init__(self) -> None:
        self.fds: dict[Path, int] = {}

    def fd(self, path: Path) -> int:
        fd = self.fds.get(path)
        if fd is None:
            fd = self.fds[path] = os.open(path, os.O_RDONLY)
        return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def file_pieces(
    files: Mapping[str, Path],
    obsm_shapes: Mapping[str, tuple[int, ...]],
    opened: OpenFiles | None = None,
) -> list[Piece]:
    """The sorted runs of one spill file set (a run ends where the planned position drops).
    `opened`: the task's open files (else each read opens its file)."""
    pos = np.fromfile(files["pos"], np.int64)
    lengths = np.fromfile(files["lengths"], np.int64)
    if lengths.size != pos.size:
        raise RuntimeError(f"spill files of {files['pos'].parent} disagree on the number of rows")
    entry0 = np.zeros(pos.size + 1, np.int64)
    np.cumsum(lengths, out=entry0[1:])
    widths = {f"{OBSM}{k}": int(np.prod(s, dtype=np.int64)) for k, s in obsm_shapes.items()}
    narrow = NARROW in files and files[NARROW].exists()

    def pread(path: Path, first: int, out: np.ndarray) -> None:
        buf = [memoryview(out).cast("B")]  # preadv into the caller's buffer: no fresh pages
        if opened is not None:
            got = os.preadv(opened.fd(path), buf, first * out.itemsize)
        else:
            with open(path, "rb") as fh:
                got = os.preadv(fh.fileno(), buf, first * out.itemsize)
        if got != out.nbytes:
            raise RuntimeError(f"spill file {path} is shorter than its rows say")

    def reader(row0: int) -> Callable[[str, int, int, np.ndarray], None]:
        def read(name: str, a: int, b: int, out: np.ndarray) -> None:
            first = entry0[row0] + a if name in ENTRY_ARRAYS else (row0 + a) * widths[name]
            if name == "indices" and narrow:
                short = thread_scratch().get(NARROW, np.uint16, out.size)
                pread(files[NARROW], int(first), short)
                out[...] = short
            else:
                pread(files[name], int(first), out)

        return read

    cuts = np.r_[0, np.flatnonzero(np.diff(pos) < 0) + 1, pos.size]
    return [
        Piece(pos[a:b], lengths[a:b], reader(int(a)))
        for a, b in zip(cuts[:-1], cuts[1:], strict=True)
        if b > a
    ]


def gather_rows(
    ptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    order: np.ndarray,
    out_indices: np.ndarray,
    out_data: np.ndarray,
) -> None:
    """Rows `order` of the CSR (ptr, indices, data), concatenated into the given buffers
    (loaders.samples.kernels)."""
    kernels.row_gather(
        ptr.astype(indices.dtype, copy=False), indices, data, order, out_indices, out_data
    )


class ShardRows:
    """The matrix (and obsm) rows of one shard in planned order, fetched one range of rows at a
    time."""

    def __init__(
        self,
        pieces: list[Piece],
        n: int,
        n_cols: int,
        obsm_shapes: Mapping[str, tuple[int, ...]],
        name: str,
        index_ranges: np.ndarray | None = None,
    ) -> None:
        self.pieces, self.n, self.n_cols, self.obsm_shapes, self.name = (
            pieces,
            n,
            n_cols,
            obsm_shapes,
            name,
        )
        # (min, max) pairs of the column indices, measured as the rows went by (saves a pass over
        # them)
        self.index_ranges = (
            None if index_ranges is None else np.asarray(index_ranges, np.int64).reshape(-1, 2)
        )
        pos = np.concatenate([p.pos for p in pieces]) if pieces else np.zeros(0, np.int64)
        seen = np.zeros(n, bool)
        if pos.size != n or (n and (pos.min() < 0 or pos.max() >= n)):
            raise RuntimeError(f"{name}: {pos.size} rows arrived, the plan has {n}")
        seen[pos] = True
        if not seen.all():
            raise RuntimeError(f"{name}: rows arrived twice or not at all")
        lengths = np.zeros(n, np.int64)
        lengths[pos] = np.concatenate([p.lengths for p in pieces]) if pieces else 0
        self.indptr = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=self.indptr[1:])
        self._cached: tuple[tuple[int, int, bool], dict[str, np.ndarray]] | None = None
        # the entry arrays of one chunk, staged and gathered, in the thread's buffers (reused
        # for the next chunk and the next shard: pipeline.buffers)
        self.scratch = thread_scratch()

    def rows(self, r0: int, r1: int, entries: bool) -> dict[str, np.ndarray]:
        """Final rows [r0, r1): their entry arrays (`entries`) or their obsm rows. The last result
        is kept, so the data and the indices chunk of one range cost one fetch and one gather (the
        writers ask for them one after the other: `zarr_direct.write_arrays`).
        Entry arrays live in reused scratch buffers: valid until the next call."""
        key = (r0, r1, entries)
        held = not entries or self.scratch.holds(self, GATHERED_NAMES)  # obsm rows: fresh arrays
        if self._cached is not None and self._cached[0] == key and held:
            return self._cached[1]
        self._cached = (
            None  # drop views of the scratch buffers, so that growing them frees the old ones
        )
        ranges = [(p, *np.searchsorted(p.pos, [r0, r1])) for p in self.pieces]
        ranges = [(p, int(a), int(b)) for p, a, b in ranges if b > a]
        if not ranges:  # no rows in range
            names = list(ENTRY_ARRAYS) if entries else [f"{OBSM}{k}" for k in self.obsm_shapes]
            return {
                name: np.zeros(
                    (0, *self.obsm_shapes.get(name[len(OBSM) :], ())),
                    ENTRY_ARRAYS.get(name, np.float32),
                )
                for name in names
            }
        pos = np.concatenate([p.pos[a:b] for p, a, b in ranges])
        order = np.empty(r1 - r0, np.int64)
        order[pos - r0] = np.arange(r1 - r0)
        if entries:
            lengths = np.concatenate([p.lengths[a:b] for p, a, b in ranges])
            ptr = np.zeros(r1 - r0 + 1, np.int64)
            np.cumsum(lengths, out=ptr[1:])
            stage = {
                name: self.scratch.get(STAGE + name, dt, int(ptr[-1]))
                for name, dt in ENTRY_ARRAYS.items()
            }
            at = 0
            for p, a, b in ranges:
                lo, hi = int(p.starts[a]), int(p.starts[b])
                for name in ENTRY_ARRAYS:
                    p.read(name, lo, hi, stage[name][at : at + hi - lo])
                at += hi - lo
            out = {
                name: self.scratch.get(GATHERED + name, dt, int(ptr[-1]))
                for name, dt in ENTRY_ARRAYS.items()
            }
            gather_rows(ptr, stage["indices"], stage["data"], order, out["indices"], out["data"])
            self.scratch.claim(self, GATHERED_NAMES)  # its views: this range, until refilled
        else:
            out = {}
            for k, shape in self.obsm_shapes.items():
                stage_k = np.concatenate([p.fetch(f"{OBSM}{k}", a, b, shape) for p, a, b in ranges])
                out[f"{OBSM}{k}"] = stage_k[order]
        self._cached = (key, out)
        return out

    def entries(self, name: str, e0: int, e1: int) -> np.ndarray:
        """Entries [e0, e1) of the shard's entry array `name`: the rows overlapping them, then a
        slice."""
        r0 = max(0, int(np.searchsorted(self.indptr, e0, "right")) - 1)
        r1 = max(r0, int(np.searchsorted(self.indptr, e1, "left")))
        off = int(self.indptr[r0])
        return self.rows(r0, r1, True)[name][e0 - off : e1 - off]

    def extreme(self, name: str, fn: Callable[[np.ndarray], np.generic]) -> int | float:
        """min or max of an entry array (of the indices, from the ranges measured on delivery if
        known; otherwise straight from the pieces: order does not matter)."""
        if name == "indices" and self.index_ranges is not None:
            col = self.index_ranges[:, 0 if fn is np.min else 1]
            return int(fn(col)) if col.size else 0
        vals = [fn(p.fetch(name, 0, int(p.starts[-1]))) for p in self.pieces if p.starts[-1]]
        return fn(np.asarray(vals)) if vals else 0

    def columns(self) -> dict[str, LazyColumn | np.ndarray]:
        """The shard's matrix and obsm columns under their format keys (X/indptr is a plain array)."""

        nnz = int(self.indptr[-1])
        out: dict[str, LazyColumn | np.ndarray] = {f"{fmt.X}/indptr": self.indptr}
        for name in ENTRY_ARRAYS:
            out[f"{fmt.X}/{name}"] = LazyColumn(self, name, (nnz,), ENTRY_ARRAYS[name])
        for k, shape in self.obsm_shapes.items():
            out[f"{fmt.OBSM_PREFIX}{k}"] = LazyColumn(
                self, f"{OBSM}{k}", (self.n, *shape), np.dtype(np.float32)
            )
        return out


class LazyColumn:
    """An array-like column of a ShardRows: shape, dtype and slices along the first axis, min/max; a
    full np.asarray() works too (writers that need whole arrays)."""

    def __init__(self, rows: ShardRows, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.rows, self.name, self.shape, self.dtype = rows, name, shape, dtype
        self.ndim, self.size = len(shape), int(np.prod(shape, dtype=np.int64))
        self.nbytes = self.size * dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, step = key.indices(self.shape[0])
        if step != 1:
            raise IndexError("LazyColumn supports contiguous slices only")
        stop = max(start, stop)
        if self.name in ENTRY_ARRAYS:
            return self.rows.entries(self.name, start, stop)
        return self.rows.rows(start, stop, False)[self.name]

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        return np.array(
            self[0 : self.shape[0]], dtype=dtype
        )  # a copy: slices are views of reused buffers

    def min(self) -> int | float:
        return self.rows.extreme(self.name, np.min)

    def max(self) -> int | float:
        return self.rows.extreme(self.name, np.max)
