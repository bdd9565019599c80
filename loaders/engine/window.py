"""Decoding one window of a split into an :class:`~loaders.samples.arena.Arena` (no torch).

:class:`WindowReader` is everything a process needs to decode windows, built from ``index.json`` and
a small JSON-able spec (which includes the sample type's config): the training process uses it in
its own threads, and the decoder process (:mod:`loaders.engine.decoder`) rebuilds the same reader
from the same spec, so both decode byte-identical arenas and no Python object ever crosses a
process boundary by pickle. What a window holds is decided by the sample type: the fields it
reads (by layout) and its tables.

The spec carries the bytes of the ``index.json`` the loader opened (and their sha256), never just
the path: a process started later decodes the same generation even after a rebuild replaced the
file, and every shard is checked against that index before it is served
(:mod:`loaders.format.integrity`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from concurrent.futures import Executor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loaders.epoch import order
from loaders.format import (
    FieldSpec,
    FormatError,
    ShardEntry,
    index_sha256,
    read_index,
    read_index_bytes,
)
from loaders.format.digests import as_stored_before
from loaders.format.integrity import (
    DatasetRebuilt,
    Generation,
    bounded_fields,
    check_on_corrupt,
    open_checked,
)
from loaders.format.readers import Column
from loaders.format.validate import validate_columns
from loaders.remote.cache import CacheError
from loaders.remote.resolve import node_cache
from loaders.samples import SampleType, check_sample_type, from_config
from loaders.samples.arena import Arena, Buffers

SPEC_KEYS = ("root", "split", "sample", "window", "seed", "shuffle")
# optional: "index" (index.json's text as the loader read it), "index_sha256", "verify",
# "on_corrupt", "remote" (a URL dataset: how to fill its cache folder, loaders.remote)
CHECK_DEFAULTS: dict[str, Any] = {"verify": True, "on_corrupt": "raise"}


@dataclass
class WindowReader:
    """How to decode and check the shards of one split, and which of them form window ``w`` of an
    epoch."""

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
    generation: Generation  # the index this reader decodes (its bytes travel in ``spec["index"]``)

    @staticmethod
    def from_spec(spec: Mapping[str, Any]) -> WindowReader:
        """A reader of the index in ``spec["index"]`` (read from ``spec["root"]`` now if absent; the
        returned reader's spec then carries it). A text whose sha256 is not
        ``spec["index_sha256"]`` is refused."""
        data = spec["index"].encode() if "index" in spec else read_index_bytes(spec["root"])
        digest = index_sha256(data)
        if spec.get("index_sha256", digest) != digest:
            raise FormatError(
                f"{spec['root']}: the index handed to this reader is not the one the loader opened "
                f"(sha256 {digest[:16]}... vs {str(spec['index_sha256'])[:16]}...)"
            )
        spec = {
            **{k: spec[k] for k in SPEC_KEYS},
            **{k: spec.get(k, v) for k, v in CHECK_DEFAULTS.items()},
            **({"remote": spec["remote"]} if spec.get("remote") else {}),
            "index": data.decode(),
            "index_sha256": digest,
        }
        check_on_corrupt(spec["on_corrupt"])
        root, split = Path(spec["root"]), str(spec["split"])
        index = read_index(root, data)
        sample = from_config(spec["sample"])
        check_sample_type(sample, index)
        sample.bind(index)
        entries = index.shards_of(split)
        fields = [index.field(n) for n in sample.fields(index)]
        tables = list(sample.tables)
        counts = np.array([e.units_of(sample.name) for e in entries], np.int64)
        first = np.zeros(len(entries), np.int64)
        first[1:] = np.cumsum(counts[:-1])
        return WindowReader(
            spec=spec,
            encoding=index.encoding,
            sample=sample,
            entries=entries,
            paths=[str(index.shard_path(e)) for e in entries],
            counts=counts,
            first_ids=first,
            fields=bounded_fields(fields, sample.field_bounds(index)),
            tables=tables,
            keys=[k for f in fields for k in f.keys()] + tables,
            generation=Generation(str(root), digest),
        )

    def fingerprint(self) -> str:
        """What this reader serves (the split's shards by content, and their unit counts): a resume
        state saved on another dataset, or on another build of this one, does not match."""
        # a sha256 digest as versions 1-3 wrote it: a state saved on such a dataset still matches
        doc = [
            [as_stored_before(e.digest) or e.file, e.records, e.units_of(self.sample.name)]
            for e in self.entries
        ]
        return hashlib.sha256(json.dumps([self.spec["split"], doc]).encode()).hexdigest()[:32]

    def window_shards(self, epoch: int, w: int) -> np.ndarray:
        shard_order, _ = order.window_bounds(
            self.counts, self.spec["seed"], epoch, self.spec["window"], self.spec["shuffle"]
        )
        return order.window_shards(shard_order, self.spec["window"], w)

    def raw_bytes(self, epoch: int, w: int) -> int:
        """Uncompressed bytes of window ``w``'s shards, per ``index.json`` (a size hint, not
        trusted)."""
        return int(
            sum(max(0, self.entries[s].raw_bytes) for s in self.window_shards(epoch, w).tolist())
        )

    def read_window(
        self, epoch: int, w: int, buffers: Buffers, pool: Executor | None = None
    ) -> Arena:
        """Decode (shards in parallel on ``pool``) and check the shards of window ``w``; errors name
        the shard.

        Two passes: the shards' metadata (sizes), then every shard decoded straight into its
        slice of the arena's buffers: no concatenation, no re-encoding."""
        shards = self.window_shards(epoch, w).tolist()

        def run(fn: Any, items: list[Any]) -> list[Any]:
            return (
                list(pool.map(fn, items))
                if pool is not None and len(items) > 1
                else [fn(x) for x in items]
            )

        bad: dict[
            int, FormatError
        ] = {}  # shards skipped (on_corrupt="skip"), by position in the window
        with self.cached([self.entries[s] for s in shards]):  # a URL dataset: fetched, pinned
            metas: list[dict[str, Column]] = run(
                lambda i: self._open(shards[i], i, bad), list(range(len(shards)))
            )
        rows = [
            0 if i in bad else self._rows(m, self.paths[s])
            for i, (m, s) in enumerate(zip(metas, shards, strict=True))
        ]
        entries = {
            f.keys()[0]: [0 if i in bad else m[f.payload].capacity for i, m in enumerate(metas)]
            for f in self.fields
            if f.layout != "dense"
        }
        arena = Arena.allocate(shards, rows, entries, self.fields, buffers)
        # on an error the buffers are not recycled: other shards of the window may still be decoding
        # into them
        units = run(lambda i: self._fill(arena, i, metas[i], bad), list(range(len(shards))))
        width = next((u.shape[1] for u in units if u.ndim == 2), 1)
        arena.set_units(units, width, [int(self.first_ids[s]) for s in shards])
        shard_idx, local_idx = order.window_units(
            self.counts, self.spec["seed"], epoch, self.spec["window"], w, self.spec["shuffle"]
        )
        # positions of skipped shards' units: -1 (Arena.order_of), dropped from their batches
        # (make_batch)
        arena.skipped = [[shards[i], str(e)] for i, e in sorted(bad.items())]
        arena.set_order(shard_idx, local_idx)
        return arena

    def cached(self, entries: list[ShardEntry]) -> AbstractContextManager[None]:
        """For a URL dataset, the window's shards in this node's cache while they are opened (each
        read whole into memory: no file is needed after); nothing to do for a local one."""
        remote = self.spec.get("remote")
        if not remote:
            return nullcontext()
        return node_cache(remote, self.spec["root"]).ready(entries)

    @property
    def on_corrupt(self) -> str:
        return str(self.spec["on_corrupt"])

    def _failed(self, s: int, error: FormatError) -> FormatError:
        """A shard that failed its checks: raised (a rebuild always is), or returned to be skipped."""
        err = self.generation.explain(error, self.paths[s])
        if self.on_corrupt == "raise" or isinstance(err, DatasetRebuilt):
            raise err from error if err is not error else None
        return err

    def _open(self, s: int, i: int, bad: dict[int, FormatError]) -> dict[str, Column]:
        try:
            try:
                return self._open_checked(s)
            except FormatError as e:
                if not self.spec.get("remote") or isinstance(e, DatasetRebuilt):
                    raise
                return self._downloaded_again(s, e)
        except FormatError as e:
            bad[i] = self._failed(s, e)
            return {}

    def _open_checked(self, s: int) -> dict[str, Column]:
        sha = self.entries[s].digest if self.spec["verify"] else None
        return open_checked(
            self.paths[s], self.encoding, self.keys, sha, self.spec["verify"] == "always"
        )

    def _downloaded_again(self, s: int, error: FormatError) -> dict[str, Column]:
        """A URL dataset's cached shard that fails its check on read (it passed when downloaded:
        this node's copy changed since) is downloaded once more and read; failing again, a
        ``CacheError`` naming the cache folder and the fix (was: every later process failed on
        the same damaged copy)."""
        cache = node_cache(self.spec["remote"], self.spec["root"])
        cache.refetch(self.entries[s])
        try:
            return self._open_checked(s)
        except FormatError as again:
            raise CacheError(
                f"{self.paths[s]}: this cached copy failed its check ({error}), was downloaded "
                f"again, and fails again ({again}): the cache folder {cache.cache_dir} does not "
                "keep what is written to it; check that disk, or choose another cache_dir= / "
                "$SHARDSMITH_CACHE"
            ) from None

    def _fill(
        self, arena: Arena, i: int, columns: dict[str, Column], bad: dict[int, FormatError]
    ) -> np.ndarray:
        if i in bad:
            return np.zeros(0, np.int64)
        try:
            return self.fill_shard(arena, i, columns)
        except FormatError as e:
            bad[i] = self._failed(int(arena.shards[i]), e)
        r0, r1 = int(arena.row_offsets[i]), int(arena.row_offsets[i + 1])
        for (
            f
        ) in self.fields:  # its rows become empty ones ending where the next shard's entries start
            if f.layout != "dense":
                arena.columns[f.keys()[0]][r0 + 1 : r1 + 1] = arena.entry_offsets[f.keys()[0]][
                    i + 1
                ]
        return np.zeros(0, np.int64)

    def _rows(self, meta: Mapping[str, Column], path: str) -> int:
        if not self.fields:
            raise FormatError(f"{path}: sample type {self.sample.name!r} reads no record field")
        f = self.fields[0]
        return (
            meta[f.name].capacity if f.layout == "dense" else max(0, meta[f.keys()[0]].capacity - 1)
        )

    def fill_shard(self, arena: Arena, i: int, columns: dict[str, Column]) -> np.ndarray:
        """Decode shard ``i`` of ``arena`` into its slices, check it, return its units (local rows)."""
        r0, r1 = int(arena.row_offsets[i]), int(arena.row_offsets[i + 1])
        cols: dict[str, np.ndarray] = {}
        for f in self.fields:
            if f.layout == "dense":
                cols[f.name] = columns[f.name].read_into(arena.columns[f.name][r0:r1])
                continue
            e0, e1 = (int(x) for x in arena.entry_offsets[f.keys()[0]][i : i + 2])
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
        found, expected = (
            (n, self.sample.count(cols)),
            (entry.records, entry.units_of(self.sample.name)),
        )
        if found != expected:
            raise FormatError(
                f"{path}: holds (records, {self.sample.name} units) = {found}, "
                f"index.json says {expected}"
            )
