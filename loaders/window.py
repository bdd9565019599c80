"""Decoding one window of a split into an :class:`~loaders.arena.Arena` (no torch).

:class:`WindowReader` is everything a process needs to decode windows, built from ``index.json`` and a
small JSON-able spec: the training process uses it in its own threads, and the decoder process
(:mod:`loaders.decoder`) rebuilds the same reader from the same spec, so both decode byte-identical
arenas and no Python object ever crosses a process boundary by pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loaders import order
from loaders.arena import DATA, INDICES, INDPTR, Arena, BufferPool, shard_units
from loaders.format import (
    COND_ID,
    OBS_PREFIX,
    OBSM_PREFIX,
    PAIRS,
    PRIMARY,
    SAMPLE_ID,
    SENTENCES_CTRL,
    SENTENCES_PERT,
    FieldSpec,
    FormatError,
    ShardEntry,
    X,
    read_index,
    validate_columns,
)
from loaders.shardio import Column, open_shard

SPEC_KEYS = ("root", "split", "sample", "window", "seed", "shuffle")
TABLES_OF = {"cells": [], "pairs": [PAIRS], "sentences": [SENTENCES_PERT, SENTENCES_CTRL]}  # per sample mode


@dataclass
class WindowReader:
    """How to decode and check the shards of one split, and which of them form window ``w`` of an epoch."""

    spec: dict[str, Any]  # SPEC_KEYS: all a process needs to rebuild this reader (JSON-able)
    encoding: str
    entries: list[ShardEntry]
    paths: list[str]
    counts: np.ndarray  # int64 [shards]: units of each shard
    fields: list[FieldSpec]
    keys: list[str]  # column keys to read per shard
    int_keys: list[str]  # cond_id, then obs codes: one int64 matrix per arena
    other_keys: list[str]  # sample_id, obsm/*
    obs_fields: list[str]
    obsm_keys: list[str]
    n_cols: int
    n_cond: int | None  # rows of the condition table (cond_id must stay below)

    @staticmethod
    def from_spec(spec: Mapping[str, Any]) -> WindowReader:
        spec = {k: spec[k] for k in SPEC_KEYS}
        root, split, sample = Path(spec["root"]), str(spec["split"]), str(spec["sample"])
        index = read_index(root)
        entries = index.shards_of(split)
        needs = TABLES_OF.get(sample, [])
        names = [f.name for f in index.fields]
        obs_fields = list(index.raw.get("obs_fields") or [n[len(OBS_PREFIX):] for n in names
                                                           if n.startswith(OBS_PREFIX)])
        obsm_keys = [n for n in names if n.startswith(OBSM_PREFIX)]
        int_keys = [COND_ID] + [OBS_PREFIX + f for f in obs_fields]
        fields = [index.field(n) for n in [X, SAMPLE_ID, PRIMARY, *int_keys, *obsm_keys]]
        cond = index.conditions or {}
        return WindowReader(
            spec=spec, encoding=index.encoding, entries=entries,
            paths=[str(index.shard_path(e)) for e in entries],
            counts=np.array([getattr(e, "primary" if sample == "cells" else sample) for e in entries], np.int64),
            fields=fields, keys=[k for f in fields for k in f.keys()] + needs, int_keys=int_keys,
            other_keys=[SAMPLE_ID, *obsm_keys], obs_fields=obs_fields, obsm_keys=obsm_keys,
            n_cols=index.field(X).shape[0], n_cond=int(cond["n"]) if cond.get("n") is not None else None)

    @property
    def sample(self) -> str:
        return str(self.spec["sample"])

    def window_shards(self, epoch: int, w: int) -> np.ndarray:
        shard_order, _ = order.window_bounds(self.counts, self.spec["seed"], epoch, self.spec["window"],
                                             self.spec["shuffle"])
        return order.window_shards(shard_order, self.spec["window"], w)

    def raw_bytes(self, epoch: int, w: int) -> int:
        """Uncompressed bytes of window ``w``'s shards, per ``index.json`` (a size hint, not trusted)."""
        return int(sum(max(0, self.entries[s].raw_bytes) for s in self.window_shards(epoch, w).tolist()))

    def read_window(self, epoch: int, w: int, buffers: BufferPool, pool: ThreadPoolExecutor | None = None) -> Arena:
        """Decode (shards in parallel on ``pool``) and check the shards of window ``w``; errors name the shard.

        Two passes: the shards' metadata (sizes), then every shard decoded straight into its slice of the
        arena's buffers: no concatenation, no re-encoding; the window's X is then one CSR matrix."""
        shards = self.window_shards(epoch, w).tolist()

        def run(fn: Any, items: list[Any]) -> list[Any]:
            return list(pool.map(fn, items)) if pool is not None and len(items) > 1 else [fn(x) for x in items]

        metas: list[dict[str, Column]] = run(lambda s: open_shard(self.paths[s], self.encoding, self.keys), shards)
        rows = [max(0, m[INDPTR].shape[0] - 1) for m in metas]
        nnz = [m[INDICES].capacity for m in metas]
        schema = {f.name: f for f in self.fields}
        other = {k: (np.dtype(schema[k].dtype), schema[k].shape) for k in self.other_keys}
        arena = Arena.allocate(shards, rows, nnz, self.int_keys, other, np.dtype(schema[X].dtype), self.n_cols,
                               buffers)
        # on an error the buffers are not recycled: other shards of the window may still be decoding into them
        units = run(lambda i: self.fill_shard(arena, i, metas[i]), list(range(len(shards))))
        width = {"cells": 1, "pairs": 2}.get(self.sample) or 2 * next((m[SENTENCES_PERT].shape[1] for m in metas), 0)
        arena.set_units(units, width)
        arena.set_order(*order.window_units(self.counts, self.spec["seed"], epoch, self.spec["window"], w,
                                            self.spec["shuffle"]))
        return arena

    def fill_shard(self, arena: Arena, i: int, columns: dict[str, Column]) -> np.ndarray:
        """Decode shard ``i`` of ``arena`` into its slices, check it, return its units (local rows)."""
        r0, r1 = int(arena.row_offsets[i]), int(arena.row_offsets[i + 1])
        e0, e1 = int(arena.nnz_offsets[i]), int(arena.nnz_offsets[i + 1])
        cols = {INDICES: columns[INDICES].read_into(arena.cols[e0:e1]),
                DATA: columns[DATA].read_into(arena.vals[e0:e1])}
        for k in self.other_keys:
            cols[k] = columns[k].read_into(arena.columns[k][r0:r1])
        cols.update({k: c.read() for k, c in columns.items() if k not in cols})
        self.check_shard(int(arena.shards[i]), cols)
        for j, k in enumerate(self.int_keys):
            arena.ints[j, r0:r1] = cols[k]  # int64: what embeddings and losses index with
        arena.set_rows(i, cols[INDPTR])
        return shard_units(cols, self.sample)

    def check_shard(self, s: int, cols: dict[str, np.ndarray]) -> None:
        path, entry = self.paths[s], self.entries[s]
        n = validate_columns(cols, self.fields, name=path)
        found = (n, int(np.count_nonzero(cols[PRIMARY])), len(cols.get(PAIRS, ())),
                 len(cols.get(SENTENCES_PERT, ())))
        expected = (entry.records, entry.primary, entry.pairs if PAIRS in cols else 0,
                    entry.sentences if SENTENCES_PERT in cols else 0)
        if found != expected:
            raise FormatError(f"{path}: holds (records, primary, pairs, sentences) = {found}, "
                              f"index.json says {expected}")
        if SENTENCES_PERT in cols and cols[SENTENCES_PERT].shape != cols[SENTENCES_CTRL].shape:
            raise FormatError(f"{path}: sentences/pert and sentences/ctrl differ in shape")
        if self.n_cond is not None and n and cols[COND_ID].max(initial=0) >= self.n_cond:
            raise FormatError(f"{path}: cond_id beyond the condition table's {self.n_cond} rows")
