"""Window arenas: one decoded window, every field's column for all its shards back to back (no
torch: the decoder process imports this).

An *arena* holds the columns a sample type reads, by field layout:

* ``dense`` ``<name>``: ``[R, *shape]``, shard after shard;
* ``csr`` ``<name>/indptr`` (int64 ``[R+1]``, rebased so the window's rows form one CSR matrix),
  ``<name>/indices``, ``<name>/data``: each shard's entries decoded straight after the previous
  shard's;
* ``ragged`` ``<name>/offsets`` (int64 ``[R+1]``, rebased likewise), ``<name>/values``.

Decoding writes each shard straight into its slice (:meth:`loaders.format.readers.Column.read_into`): no
concatenation, no re-encoding; a batch then gathers rows with one vectorised call per field
(:mod:`loaders.samples.gather`). The big arrays are recycled by a :class:`BufferPool` (fresh memory costs
a page fault per 4 KiB), or live in a shared slab filled by the decoder process
(:mod:`loaders.engine.decoder`), which is why an arena is nothing but named arrays plus a
JSON-able layout map.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from loaders.format.values import FieldSpec

ALIGN = 64
KEEP_BYTES = 1 << 20  # arrays at least this big go back to the pool on release
INDEX_ARRAYS = ("shards", "row_offsets", "unit_offsets", "units", "order", "unit_ids")


class BufferPool:
    """Big 64-byte-aligned arrays recycled between windows (and epochs) of one process.

    The owners are uint64 arrays: numpy points every view's ``base`` at the owner, and scipy
    copies a CSR component whose base has more than twice its number of *elements*
    (``_prune_array``), which a float32 view of a uint8 owner always has."""

    def __init__(self, keep: int = 12) -> None:
        self.keep, self.pid = keep, os.getpid()
        self._free: list[np.ndarray] = []  # raw uint64 owners
        self._lock = threading.Lock()

    def get(self, n: int, dtype: np.dtype) -> np.ndarray:
        size = n * np.dtype(dtype).itemsize
        need = size + ALIGN
        with self._lock:
            fits = [b for b in self._free if need <= b.nbytes <= 2 * need]
            raw = min(fits, key=lambda b: b.nbytes) if fits else None
            if raw is not None:
                self._free = [b for b in self._free if b is not raw]
        if raw is None:  # headroom: the next window is a little bigger or smaller
            raw = np.empty(-(-(need + need // 32) // 8), np.uint64)
        raw8 = raw.view(np.uint8)
        skip = -raw8.ctypes.data % ALIGN
        return raw8[skip : skip + size].view(dtype)

    def clear(self) -> None:
        """Let go of every recycled buffer (e.g. once a decoder process serves the windows instead)."""
        with self._lock:
            self._free.clear()

    def put(self, *arrays: np.ndarray) -> None:
        with self._lock:
            for a in arrays:
                raw = a
                while isinstance(raw.base, np.ndarray):
                    raw = raw.base
                if (
                    raw.dtype == np.uint64
                    and raw.ndim == 1
                    and all(raw is not b for b in self._free)
                ):
                    self._free.append(raw)
            del self._free[: -self.keep]


class Buffers(Protocol):
    """Where an arena's arrays go: a :class:`BufferPool`, or a decoder slab
    (``loaders.engine.decoder``)."""

    def get(self, n: int, dtype: np.dtype) -> np.ndarray: ...

    def put(self, *arrays: np.ndarray) -> None: ...


def _layouts(specs: Sequence[FieldSpec]) -> dict[str, list[Any]]:
    return {f.name: [f.layout, f.dtype, list(f.shape)] for f in specs}


@dataclass
class Arena:
    """One decoded window: its shards' rows side by side, plus the rows each unit refers to."""

    shards: (
        np.ndarray
    )  # int64 [k]: shard ids (positions in the split's shard list), in concatenation order
    row_offsets: np.ndarray  # int64 [k+1]: rows of shard i are [row_offsets[i], row_offsets[i+1])
    columns: dict[str, np.ndarray]  # flat key -> array (pointer columns rebased, int64)
    layouts: dict[str, list[Any]]  # field name -> [layout, dtype, shape] (JSON-able)
    entry_offsets: dict[str, np.ndarray] = field(default_factory=dict)  # pointer key -> int64 [k+1]
    unit_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))  # int64 [k+1]
    units: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 1), np.int64)
    )  # int64 [U, width] arena rows
    order: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.int64)
    )  # unit (row of units) per position
    unit_ids: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.int64)
    )  # int64 [U]: stable unit ids
    on_release: Callable[[], None] | None = (
        None  # set when the buffers are not the pool's (a decoder slab)
    )
    narrow: dict[str, np.ndarray] = field(
        default_factory=dict
    )  # csr indptr in the indices' dtype (seal)
    stacks: dict[tuple[str, ...], np.ndarray] = field(default_factory=dict)  # see stacked()
    skipped: list[list[Any]] = field(
        default_factory=list
    )  # [shard id, why] of shards skipped (order: -1)

    @staticmethod
    def allocate(
        shards: Sequence[int],
        rows: Sequence[int],
        entries: Mapping[str, Sequence[int]],
        specs: Sequence[FieldSpec],
        pool: Buffers,
    ) -> Arena:
        """Empty buffers for shards with ``rows[i]`` rows and ``entries[pointer key][i]`` entries."""
        row_off = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(rows, out=row_off[1:])
        n = int(row_off[-1])
        columns: dict[str, np.ndarray] = {}
        entry_offsets: dict[str, np.ndarray] = {}
        for f in specs:
            if f.layout == "dense":
                inner = int(np.prod(f.shape, dtype=np.int64))
                columns[f.name] = pool.get(n * inner, np.dtype(f.dtype)).reshape(n, *f.shape)
                continue
            ptr = f.keys()[0]
            off = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(entries[ptr], out=off[1:])
            entry_offsets[ptr] = off
            cap = max(1, int(off[-1]))
            columns[ptr] = pool.get(n + 1, np.dtype(np.int64))
            columns[ptr][0] = 0
            if f.layout == "csr":
                columns[f"{f.name}/indices"] = pool.get(cap, np.dtype(np.int32))
                columns[f.payload] = pool.get(cap, np.dtype(f.dtype))
            else:
                inner = int(np.prod(f.shape, dtype=np.int64))
                columns[f.payload] = pool.get(cap * inner, np.dtype(f.dtype)).reshape(cap, *f.shape)
        return Arena(np.asarray(shards, np.int64), row_off, columns, _layouts(specs), entry_offsets)

    @property
    def n_rows(self) -> int:
        return int(self.row_offsets[-1])

    def set_pointers(self, i: int, key: str, local: np.ndarray) -> None:
        """Row pointers of shard ``i`` for ``key`` (its own, validated), rebased to where its
        entries went."""
        r0, r1 = int(self.row_offsets[i]), int(self.row_offsets[i + 1])
        np.add(local[1:], self.entry_offsets[key][i], out=self.columns[key][r0 + 1 : r1 + 1])

    def seal(self) -> None:
        """Ready for gathers: csr pointers in the dtype of their indices (what scipy's kernels
        take)."""
        for name, (layout, _dt, _shape) in self.layouts.items():
            if layout != "csr":
                continue
            ptr = self.columns[f"{name}/indptr"]
            nnz = int(ptr[-1]) if ptr.size else 0
            self.narrow[name] = ptr.astype(np.int32) if nnz < 2**31 - 1 else ptr

    def stacked(self, names: tuple[str, ...]) -> np.ndarray:
        """int64 ``[len(names), R]``: the 1-D dense fields ``names`` side by side, built once per
        window in each process that asks. A batch then gets all of them with ONE ``take``
        (per-field takes plus int64 casts cost ~12 us of a ~110 us cells batch in Python overhead
        alone)."""
        got = self.stacks.get(names)
        if got is None:
            got = np.empty((len(names), self.n_rows), np.int64)
            for i, name in enumerate(names):
                got[i] = self.columns[name].reshape(self.n_rows)  # a field of shape () only
            self.stacks[names] = got
        return got

    def set_units(
        self, per_shard: Sequence[np.ndarray], width: int, first_ids: Sequence[int]
    ) -> None:
        """Units of every shard (local rows ``[U_i, width]``), made arena rows; ``first_ids[i]``:
        the stable id of shard i's first unit (units are numbered through the split's shards in
        index order)."""
        parts = [
            np.asarray(u, np.int64).reshape(-1, width) + self.row_offsets[i]
            for i, u in enumerate(per_shard)
        ]
        self.units = np.concatenate(parts) if parts else np.zeros((0, width), np.int64)
        self.unit_offsets = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([u.shape[0] for u in parts], out=self.unit_offsets[1:])
        ids = [
            np.arange(u.shape[0], dtype=np.int64) + int(f)
            for u, f in zip(parts, first_ids, strict=True)
        ]
        self.unit_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)

    def set_order(self, shard_idx: np.ndarray, local_idx: np.ndarray) -> None:
        """Positions of the window (``order.window_units``) as rows of ``units``."""
        self.order = self.order_of(shard_idx, local_idx)

    def order_of(self, shard_idx: np.ndarray, local_idx: np.ndarray) -> np.ndarray:
        srt = np.argsort(self.shards)
        slot = srt[np.searchsorted(self.shards, shard_idx, sorter=srt)]
        got = self.unit_offsets[slot] + local_idx
        if (
            self.skipped
        ):  # units of shards skipped (on_corrupt="skip"): -1, left out of their batches
            got = np.where(np.isin(shard_idx, [int(s) for s, _ in self.skipped]), -1, got)
        return got

    def view(self, order: np.ndarray, on_release: Callable[[], None]) -> Arena:
        """The same decoded rows in another order (a window of the same shards in another epoch):
        shares every buffer; ``on_release`` runs instead of recycling them (the owner counts its
        views)."""
        return replace(self, order=order, on_release=on_release)

    def release(self, pool: BufferPool) -> None:
        """Hand the big buffers back (the arena must not be used afterwards)."""
        self.narrow, self.stacks = {}, {}
        if self.on_release is not None:
            self.on_release()
        else:
            pool.put(*[a for a in self.columns.values() if a.nbytes >= KEEP_BYTES])

    # -- crossing a process boundary as named arrays (loaders.engine.decoder)
    # --------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        """Every array of the arena by a flat name."""
        out = {name: getattr(self, name) for name in INDEX_ARRAYS}
        out.update({f"col:{k}": v for k, v in self.columns.items()})
        out.update({f"ent:{k}": v for k, v in self.entry_offsets.items()})
        return out

    @staticmethod
    def from_arrays(arrays: Mapping[str, np.ndarray], layouts: Mapping[str, list[Any]]) -> Arena:
        a = Arena(
            arrays["shards"],
            arrays["row_offsets"],
            {k[4:]: v for k, v in arrays.items() if k.startswith("col:")},
            dict(layouts),
            {k[4:]: v for k, v in arrays.items() if k.startswith("ent:")},
        )
        a.unit_offsets, a.units, a.order, a.unit_ids = (arrays[n] for n in INDEX_ARRAYS[2:])
        return a

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays().values()))
