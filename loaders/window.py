"""Decoding one window of a split into an :class:`~loaders.arena.Arena` (no torch).

:class:`WindowReader` is everything a process needs to decode windows, built from ``index.json`` and a
small JSON-able spec (which includes the sample type's config): the training process uses it in its own
threads, and the decoder process (:mod:`loaders.decoder`) rebuilds the same reader from the same spec, so
both decode byte-identical arenas and no Python object ever crosses a process boundary by pickle.
What a window holds is decided by the sample type: the fields it reads (by layout) and its tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loaders import order
from loaders.arena import Arena, Buffers
from loaders.format import FieldSpec, FormatError, ShardEntry, read_index, validate_columns
from loaders.samples import SampleType, from_config
from loaders.shardio import Column, open_shard

SPEC_KEYS = ("root", "split", "sample", "window", "seed", "shuffle")


@dataclass
class WindowReader:
    """How to decode and check the shards of one split, and which of them form window ``w`` of an epoch."""

    spec: dict[str, Any]  # SPEC_KEYS: all a process needs to rebuild this reader (JSON-able)
    encoding: str
    sample: SampleType
    entries: list[ShardEntry]
    paths: list[str]
    counts: np.ndarray  # int64 [shards]: units of each shard
    first_ids: np.ndarray  # int64 [shards]: stable id of each shard's first unit
    fields: list[FieldSpec]  # the fields the sample type reads
    tables: list[str]
    keys: list[str]  # column keys to read per shard

    @staticmethod
    def from_spec(spec: Mapping[str, Any]) -> WindowReader:
        spec = {k: spec[k] for k in SPEC_KEYS}
        root, split = Path(spec["root"]), str(spec["split"])
        index = read_index(root)
        sample = from_config(spec["sample"])
        sample.check(index)
        sample.bind(index)
        entries = index.shards_of(split)
        fields = [index.field(n) for n in sample.fields(index)]
        tables = list(sample.tables)
        counts = np.array([e.units_of(sample.name) for e in entries], np.int64)
        first = np.zeros(len(entries), np.int64)
        first[1:] = np.cumsum(counts[:-1])
        return WindowReader(spec=spec, encoding=index.encoding, sample=sample, entries=entries,
                            paths=[str(index.shard_path(e)) for e in entries], counts=counts, first_ids=first,
                            fields=fields, tables=tables, keys=[k for f in fields for k in f.keys()] + tables)

    def window_shards(self, epoch: int, w: int) -> np.ndarray:
        shard_order, _ = order.window_bounds(self.counts, self.spec["seed"], epoch, self.spec["window"],
                                             self.spec["shuffle"])
        return order.window_shards(shard_order, self.spec["window"], w)

    def raw_bytes(self, epoch: int, w: int) -> int:
        """Uncompressed bytes of window ``w``'s shards, per ``index.json`` (a size hint, not trusted)."""
        return int(sum(max(0, self.entries[s].raw_bytes) for s in self.window_shards(epoch, w).tolist()))

    def read_window(self, epoch: int, w: int, buffers: Buffers, pool: ThreadPoolExecutor | None = None) -> Arena:
        """Decode (shards in parallel on ``pool``) and check the shards of window ``w``; errors name the shard.

        Two passes: the shards' metadata (sizes), then every shard decoded straight into its slice of the
        arena's buffers: no concatenation, no re-encoding."""
        shards = self.window_shards(epoch, w).tolist()

        def run(fn: Any, items: list[Any]) -> list[Any]:
            return list(pool.map(fn, items)) if pool is not None and len(items) > 1 else [fn(x) for x in items]

        metas: list[dict[str, Column]] = run(lambda s: open_shard(self.paths[s], self.encoding, self.keys), shards)
        rows = [self._rows(m, self.paths[s]) for m, s in zip(metas, shards, strict=True)]
        entries = {f.keys()[0]: [m[f.payload].capacity for m in metas] for f in self.fields if f.layout != "dense"}
        arena = Arena.allocate(shards, rows, entries, self.fields, buffers)
        # on an error the buffers are not recycled: other shards of the window may still be decoding into them
        units = run(lambda i: self.fill_shard(arena, i, metas[i]), list(range(len(shards))))
        width = next((u.shape[1] for u in units if u.ndim == 2), 1)
        arena.set_units(units, width, [int(self.first_ids[s]) for s in shards])
        arena.set_order(*order.window_units(self.counts, self.spec["seed"], epoch, self.spec["window"], w,
                                            self.spec["shuffle"]))
        return arena

    def _rows(self, meta: Mapping[str, Column], path: str) -> int:
        if not self.fields:
            raise FormatError(f"{path}: sample type {self.sample.name!r} reads no record field")
        f = self.fields[0]
        return meta[f.name].capacity if f.layout == "dense" else max(0, meta[f.keys()[0]].capacity - 1)

    def fill_shard(self, arena: Arena, i: int, columns: dict[str, Column]) -> np.ndarray:
        """Decode shard ``i`` of ``arena`` into its slices, check it, return its units (local rows)."""
        r0, r1 = int(arena.row_offsets[i]), int(arena.row_offsets[i + 1])
        cols: dict[str, np.ndarray] = {}
        for f in self.fields:
            if f.layout == "dense":
                cols[f.name] = columns[f.name].read_into(arena.columns[f.name][r0:r1])
                continue
            e0, e1 = (int(x) for x in arena.entry_offsets[f.keys()[0]][i:i + 2])
            for k in f.keys()[1:]:
                cols[k] = columns[k].read_into(arena.columns[k][e0:e1])
        cols.update({k: c.read() for k, c in columns.items() if k not in cols})
        self.check_shard(int(arena.shards[i]), cols)
        for f in self.fields:
            if f.layout != "dense":
                arena.set_pointers(i, f.keys()[0], cols[f.keys()[0]])
        return self.sample.units(cols)

    def check_shard(self, s: int, cols: dict[str, np.ndarray]) -> None:
        path, entry = self.paths[s], self.entries[s]
        n = validate_columns(cols, self.fields, self.tables, name=path)
        self.sample.check_columns(cols, path)
        found, expected = (n, self.sample.count(cols)), (entry.records, entry.units_of(self.sample.name))
        if found != expected:
            raise FormatError(f"{path}: holds (records, {self.sample.name} units) = {found}, "
                              f"index.json says {expected}")
