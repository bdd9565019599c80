"""Gathering rows of a batch from window arenas: one function per field layout, shared by every
sample type.

A batch's rows may come from one arena (the common case) or from several (a batch straddling two
windows):
:class:`Rows` gathers from each arena its share with one vectorised call per field and puts the
results back in batch order. No Python loop over rows or units (except one over long ragged
lists: see
:func:`ragged_rows`). No torch here (the decoder process and DataLoader workers import this).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loaders.samples import kernels
from loaders.samples.arena import Arena
from loaders.samples.ops import LAYOUT_ITEMS
from loaders.samples.payload import Deferred


def take_dense(arena: Arena, name: str, rows: np.ndarray) -> np.ndarray:
    return arena.columns[name].take(rows, axis=0)


def take_ints(arena: Arena, names: tuple[str, ...], rows: np.ndarray) -> np.ndarray:
    """int64 ``[len(names), m]``: several 1-D integer dense fields of ``rows`` in one gather."""
    return arena.stacked(names).take(rows, axis=1)


def take_csr(
    arena: Arena, name: str, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(crow, indices, data)`` of ``rows`` of csr field ``name`` (scipy's row gather, one C++
    pass)."""
    ptr = arena.narrow.get(name)
    if ptr is None:
        arena.seal()
        ptr = arena.narrow[name]
    return kernels.row_gather(
        ptr,
        arena.columns[f"{name}/indices"],
        arena.columns[f"{name}/data"],
        rows,
        n_cols=int(arena.layouts[name][2][0]),
    )


SLICE_MIN_MEAN = (
    128  # elements per list from which copying slices beats an element index (measured: ~100)
)


def ragged_rows(
    offsets: np.ndarray, values: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets int64 [m+1], values)`` of ``rows`` of a ragged column, in order.

    Short lists (spikes of a clip, tokens): one int64 index per element and one ``take``. Long
    lists (a CT volume's 500k points): one slice copy per list, the only loop over rows in this
    module, taken when the lists average ``SLICE_MIN_MEAN`` elements or more, so it is < 1% of
    the copying (4 lists of 500k: 25x faster than the index, which costs 3 passes of 8 bytes per
    element)."""
    r = np.asarray(rows, np.int64).reshape(-1)
    starts = offsets[r]
    lengths = offsets[r + 1] - starts
    out = np.zeros(r.size + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    total = int(out[-1])
    if r.size and total >= SLICE_MIN_MEAN * r.size:
        return out, np.concatenate(
            [values[s:e] for s, e in zip(starts.tolist(), (starts + lengths).tolist(), strict=True)]
        )
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - out[:-1], lengths)
    return out, np.take(values, idx, axis=0)


def take_ragged(arena: Arena, name: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ragged_rows(arena.columns[f"{name}/offsets"], arena.columns[f"{name}/values"], rows)


@dataclass
class Ragged:
    """Variable-length lists of a batch: element ``i`` is ``values[offsets[i]:offsets[i+1]]``."""

    offsets: np.ndarray  # int64 [m+1]
    values: np.ndarray  # [total, *shape]


class Rows:
    """Rows to gather, possibly spread over several arenas (``group[i]``: the arena of row ``i``)."""

    def __init__(self, arenas: Sequence[Arena], group: np.ndarray | None, rows: np.ndarray) -> None:
        self.arenas = list(arenas)
        self.rows = np.asarray(rows).reshape(-1)
        self.group = (
            None
            if group is None or len(self.arenas) == 1
            else np.broadcast_to(group, np.shape(rows)).reshape(-1)
        )

    def __len__(self) -> int:
        return int(self.rows.size)

    def _groups(self) -> list[tuple[Arena, np.ndarray]]:
        assert self.group is not None
        return [
            (a, sel)
            for i, a in enumerate(self.arenas)
            if (sel := np.flatnonzero(self.group == i)).size
        ]

    def arena_rows(self) -> list[tuple[Arena, int]]:
        """(arena, row) of every row, in order: for per-row slicing a sample type does itself (e.g.
        crops)."""
        if self.group is None:
            return [(self.arenas[0], r) for r in self.rows.tolist()]
        return [
            (self.arenas[g], r)
            for g, r in zip(self.group.tolist(), self.rows.tolist(), strict=True)
        ]

    def take(self, name: str) -> np.ndarray:
        """A dense field's values for the rows."""
        if self.group is None:
            return take_dense(self.arenas[0], name, self.rows)
        first = self.arenas[0].columns[name]
        out = np.empty((self.rows.size, *first.shape[1:]), first.dtype)
        for arena, sel in self._groups():
            out[sel] = take_dense(arena, name, self.rows[sel])
        return out

    def ints(self, names: Sequence[str]) -> np.ndarray:
        """int64 ``[len(names), m]``: 1-D integer dense fields (codes, ids) of the rows in ONE
        gather; row ``i`` is field ``names[i]`` as int64 (what embeddings and losses index with).
        Prefer it to one
        :meth:`take` + cast per field on a hot path."""
        key = tuple(names)
        if self.group is None:
            return take_ints(self.arenas[0], key, self.rows)
        out = np.empty((len(key), self.rows.size), np.int64)
        for arena, sel in self._groups():
            out[:, sel] = take_ints(arena, key, self.rows[sel])
        return out

    def csr_parts(self, name: str, n_cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A csr field's rows as ``(crow [m+1], indices [nnz], data [nnz])``, in order (copies:
        valid after their window is recycled; ``n_cols``: the field's column count)."""
        if self.group is None:
            return take_csr(self.arenas[0], name, self.rows)
        groups = self._groups()
        parts = [take_csr(a, name, self.rows[sel]) for a, sel in groups]
        crow = np.zeros(self.rows.size + 1, np.int64)
        np.cumsum(np.concatenate([np.diff(p[0]) for p in parts]), out=crow[1:])
        stacked = (
            crow,
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        )
        back = np.empty(self.rows.size, np.int64)
        back[np.concatenate([sel for _, sel in groups])] = np.arange(self.rows.size)
        ptr = stacked[0].astype(stacked[1].dtype) if int(crow[-1]) < 2**31 - 1 else stacked[0]
        return kernels.row_gather(ptr, stacked[1], stacked[2], back, n_cols=int(n_cols))

    def csr(self, name: str, shape: tuple[int, ...]) -> Deferred:
        """A csr field's rows as the deferred item registered for the layout
        (``LAYOUT_ITEMS["csr"]``: rows finished dense as ``shape``, flattened over its leading
        dims). A sample type that wants another form builds its own item from :meth:`csr_parts`."""
        return LAYOUT_ITEMS.get("csr")(*self.csr_parts(name, int(shape[-1])), shape)

    def ragged(self, name: str) -> Ragged:
        """A ragged field's lists for the rows."""
        if self.group is None:
            return Ragged(*take_ragged(self.arenas[0], name, self.rows))
        groups = self._groups()
        parts = [take_ragged(a, name, self.rows[sel]) for a, sel in groups]
        off = np.zeros(self.rows.size + 1, np.int64)
        np.cumsum(np.concatenate([np.diff(p[0]) for p in parts]), out=off[1:])
        back = np.empty(self.rows.size, np.int64)
        back[np.concatenate([sel for _, sel in groups])] = np.arange(self.rows.size)
        return Ragged(*ragged_rows(off, np.concatenate([p[1] for p in parts]), back))


@dataclass
class BatchRows:
    """What :meth:`loaders.samples.SampleType.assemble` gets: the batch's units as arena rows."""

    arenas: list[Arena]
    group: np.ndarray | None  # int64 [b]: the arena of each unit (None: all in arenas[0])
    units: np.ndarray  # int64 [b, width]: arena rows of each unit
    unit_ids: np.ndarray  # int64 [b]: stable ids (the same unit has the same id every epoch)
    seed: int
    epoch: int

    @property
    def size(self) -> int:
        return int(self.units.shape[0])

    def rows(self, columns: slice | int = slice(None)) -> Rows:
        """Rows of the units' columns ``columns`` (row-major: unit 0's rows first)."""
        sel = self.units[:, columns]
        sel = sel[:, None] if sel.ndim == 1 else sel
        grp = None if self.group is None else self.group[:, None]
        return Rows(self.arenas, grp, sel)
