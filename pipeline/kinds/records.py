"""Record kinds: datasets whose records are items (a spike window, a CT volume), not rows of a matrix.

A record kind implements four small methods and inherits the rest (scan, split, plan, pack, incremental):

* :meth:`RecordKind.scan_source`: the :class:`Record` s one source file holds (metadata only, cheap);
* :meth:`RecordKind.schema`: its ``FieldSpec`` s (dense, ragged) and :meth:`RecordKind.tables`;
* :meth:`RecordKind.read_record`: one record's values (a dict field -> array) and JSON-able metadata, or
  ``raise SkipRecord(reason)``: the record is left out, counted under that reason in the index and logged;
* optionally :meth:`RecordKind.shard_tables` (tables of local row ids built from a shard's kept records,
  e.g. spike clips) and :meth:`RecordKind.section` (settings stored in ``index.json``).

Splits: a record's ``split`` when its source layout says so (a ``train/`` folder), else drawn per *group*
from a stable hash of (seed, group) and the kind's fractions, so the records of one group (a sequence, a
patient) never cross splits. Shards hold records of one split, groups kept together and in order, cut at
about ``shard_size_mb`` (at a group boundary unless one group alone is bigger). One pack task per shard reads
its records one by one (memory: one shard), so any ``--jobs`` and backend give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders import format as fmt
from pipeline.kinds.base import Kind, KindPlan, PackResult, PlanContext, ShardPlan, Task
from pipeline.plan.splits import stable_unit

if TYPE_CHECKING:
    from pipeline.manifest import Manifest, SourceSpec
    from pipeline.pack import PackConfig
    from pipeline.scan import ScannedSource

log = logging.getLogger(__name__)
SPLIT_NAMES = ("train", "val", "test")


class SkipRecord(Exception):
    """Raised by ``read_record``: leave this record out, counted under ``reason`` (a short, stable phrase)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Record:
    """One record a source holds, as its kind's scan found it."""

    index: int  # its number within the source
    group: str  # records of one group never cross splits (a sequence, a patient)
    order: tuple[Any, ...] = ()  # sort key within the group (e.g. the frame number)
    split: str | None = None  # fixed by the source layout, else drawn per group
    nbytes: int = 0  # estimated uncompressed bytes (shard sizing)
    info: Mapping[str, Any] = field(default_factory=dict)  # JSON-able facts read_record needs


class RecordKind(Kind):
    """Base of record kinds (see module docstring)."""

    @abstractmethod
    def scan_source(self, manifest: Manifest, spec: SourceSpec) -> list[Record]:
        """The records of one source (metadata only); raise SourceError naming the file on bad input."""

    @abstractmethod
    def schema(self, manifest: Manifest, scanned: Sequence[ScannedSource]) -> tuple[fmt.FieldSpec, ...]:
        """The record fields (``sample_id`` is filled in by the base class when listed)."""

    @abstractmethod
    def read_record(self, manifest: Manifest, spec: SourceSpec, record: Record) -> tuple[dict[str, np.ndarray], Any]:
        """One record's values by field name (dense: ``shape``; ragged: ``[k, *shape]``) and its JSON-able
        metadata; ``raise SkipRecord(reason)`` to leave it out (counted)."""

    def tables(self, manifest: Manifest) -> tuple[str, ...]:
        return ()

    def shard_tables(self, manifest: Manifest, records: Sequence[Record]) -> dict[str, np.ndarray]:
        """Tables of local row ids for a shard whose kept records are ``records`` (in shard order)."""
        return {}

    def fractions(self, config: Any) -> tuple[float, float]:
        """(val, test) fractions of groups drawn into those splits when the layout does not fix them."""
        return float(getattr(config, "val_fraction", 0.1)), float(getattr(config, "test_fraction", 0.1))

    def section(self, manifest: Manifest) -> dict[str, Any]:
        """The kind's settings as stored in ``index.json`` (``sections[kind]``)."""
        return {}

    def prepare(self, manifest: Manifest, records: list[tuple[int, Record]]) -> list[tuple[int, Record]]:
        """All (source ordinal, record) pairs before planning: a hook for dataset-wide facts (e.g. a
        sequence vocabulary added to each record's ``info``). The default keeps them as they are."""
        return records

    # -- the inherited machinery ---------------------------------------------------------------------
    def scan(self, manifest: Manifest, cache: Mapping[str, Mapping[str, object]] | None,
             hasher: Executor | None) -> list[ScannedSource]:
        from pipeline.scan import ScannedSource, fingerprint

        out = []
        for i, spec in enumerate(manifest.sources):
            records = self.scan_source(manifest, spec)
            pending = fingerprint(spec.path, cache) if hasher is None else hasher.submit(fingerprint, spec.path, cache)
            out.append(ScannedSource(i, spec, pending, records, {}))
        return out

    def plan(self, manifest: Manifest, scanned: Sequence[ScannedSource], ctx: PlanContext) -> KindPlan:
        flat = self.prepare(manifest, [(s.ordinal, r) for s in scanned for r in s.meta])
        val, test = self.fractions(manifest.config)
        cap = manifest.shard_size_mb * (1 << 20)
        by_split: dict[str, list[int]] = {n: [] for n in SPLIT_NAMES}
        for number, (_src, rec) in enumerate(flat):
            split = rec.split
            if split is None:
                u = stable_unit(manifest.seed, self.name, rec.group)
                split = "test" if u < test else "val" if u < test + val else "train"
            if split not in by_split:
                raise ValueError(f"record {rec.group}/{rec.index}: split {split!r} is not one of {SPLIT_NAMES}")
            by_split[split].append(number)
        shards: list[ShardPlan] = []
        for split, numbers in by_split.items():
            numbers.sort(key=lambda k: (flat[k][1].group, flat[k][1].order, flat[k][0], flat[k][1].index))
            for part, members in enumerate(_cut(numbers, [flat[k][1] for k in numbers], cap)):
                rows = np.asarray(members, np.int64)
                sources = {flat[k][0] for k in members}
                shard = ShardPlan(split, sources.pop() if len(sources) == 1 else -1, part, rows, {})
                shard.key = self._key(manifest, scanned, flat, rows)
                shards.append(shard)
        groups = {n: len({flat[k][1].group for k in v}) for n, v in by_split.items()}
        stats = {"records": len(flat), "records_per_split": {n: len(v) for n, v in by_split.items()},
                 "groups_per_split": groups}
        return KindPlan(shards=shards, fields=self.schema(manifest, scanned), tables=self.tables(manifest),
                        section=self.section(manifest), stats=stats, extra=flat)

    def _key(self, manifest: Manifest, scanned: Sequence[ScannedSource], flat: list[tuple[int, Record]],
             rows: np.ndarray) -> str:
        """Everything a shard's bytes depend on: format, encoding, codec, the kind's settings (the manifest's
        sections of this kind), each record's source content and identity, and the code of the kind."""
        h = hashlib.sha256()
        doc = {"format": fmt.SHARD_VERSION, "kind": self.name, "encoding": manifest.format,
               "codec": [manifest.codec, manifest.codec_level], "seed": manifest.seed,
               "sections": {k: manifest.raw.get(k) for k in self.sections}}
        h.update(json.dumps(doc, sort_keys=True, default=str).encode())
        for k in rows.tolist():
            src, rec = flat[k]
            h.update(json.dumps([k, scanned[src].fingerprint.sha256, rec.index, rec.group, list(rec.order),
                                 dict(rec.info)], sort_keys=True, default=str).encode())
        return h.hexdigest()

    def pack_tasks(self, manifest: Manifest, plan: KindPlan, scanned: Sequence[ScannedSource], todo: Sequence[int],
                   cfg: PackConfig) -> tuple[list[Task], list[Task]]:
        specs = [s.spec for s in scanned]
        return [], [partial(self._pack_one, manifest, plan.shards[i], i, specs, plan.extra, cfg) for i in todo]

    def _pack_one(self, manifest: Manifest, shard: ShardPlan, number: int, specs: Sequence[SourceSpec],
                  flat: list[tuple[int, Record]], cfg: PackConfig) -> list[PackResult]:
        from pipeline.shardfile import finish_shard

        values: dict[str, list[np.ndarray]] = {f.name: [] for f in cfg.fields}
        kept: list[Record] = []
        metas: list[Any] = []
        ids: list[int] = []
        skipped: dict[str, int] = {}
        for k in shard.rows.tolist():
            src, rec = flat[k]
            try:
                record, meta = self.read_record(manifest, specs[src], rec)
            except SkipRecord as e:
                skipped[e.reason] = skipped.get(e.reason, 0) + 1
                log.warning("%s: record %s skipped: %s%s", specs[src].path, rec.index, e.reason,
                            f" ({e.detail})" if e.detail else "")
                continue
            for f in cfg.fields:
                if f.name != fmt.SAMPLE_ID:
                    values[f.name].append(np.asarray(record[f.name], dtype=f.dtype))
            kept.append(rec)
            metas.append(meta)
            ids.append(k)
        columns: dict[str, np.ndarray] = {}
        for f in cfg.fields:
            if f.name == fmt.SAMPLE_ID:
                columns[f.name] = np.asarray(ids, np.int64)
            elif f.layout == "dense":
                columns[f.name] = np.stack(values[f.name]) if kept else np.zeros((0, *f.shape), f.dtype)
            elif f.layout == "ragged":
                parts = values[f.name]
                offsets = np.zeros(len(parts) + 1, np.int64)
                np.cumsum([p.shape[0] for p in parts], out=offsets[1:])
                columns[f"{f.name}/offsets"] = offsets
                columns[f"{f.name}/values"] = np.concatenate(parts) if parts else np.zeros((0, *f.shape), f.dtype)
            else:
                raise ValueError(f"{self.name}: record kinds store dense and ragged fields, not {f.layout!r}")
        columns.update(self.shard_tables(manifest, kept))
        return [PackResult(number, finish_shard(columns, shard, cfg), skipped, metas)]


def _cut(numbers: list[int], records: list[Record], cap: float) -> list[list[int]]:
    """Consecutive runs of about ``cap`` bytes, cut at group boundaries unless one group alone is bigger."""
    out: list[list[int]] = []
    cur: list[int] = []
    size = 0.0
    i = 0
    while i < len(numbers):
        j = i
        while j < len(numbers) and records[j].group == records[i].group:
            j += 1
        group_size = sum(max(1, r.nbytes) for r in records[i:j])
        if cur and size + group_size > cap:
            out.append(cur)
            cur, size = [], 0.0
        if group_size > cap:  # a group bigger than a shard: cut inside it
            for k in range(i, j):
                if cur and size + max(1, records[k].nbytes) > cap:
                    out.append(cur)
                    cur, size = [], 0.0
                cur.append(numbers[k])
                size += max(1, records[k].nbytes)
        else:
            cur.extend(numbers[i:j])
            size += group_size
        i = j
    if cur:
        out.append(cur)
    return out
