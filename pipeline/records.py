"""Record kinds: datasets whose records are items (a spike window, a CT volume), not rows of a
matrix.

A record kind implements four small methods and inherits the rest (scan, split, plan, pack,
incremental):

* :meth:`RecordKind.scan_source`: the :class:`Record` s one source file holds (metadata only,
cheap);
* :meth:`RecordKind.schema`: its ``FieldSpec`` s (dense, ragged) and :meth:`RecordKind.tables`;
* :meth:`RecordKind.read_record`: one record's values (a dict field -> array) and JSON-able
metadata, or
  ``raise SkipRecord(reason)``: the record is left out, counted under that reason in the index and
  logged;
* optionally :meth:`RecordKind.shard_tables` (tables of local row ids built from a shard's kept
records,
  e.g. spike clips) and :meth:`RecordKind.section` (settings stored in ``index.json``).

Splits: a record's ``split`` when its source layout says so (a ``train/`` folder), else drawn per
*group* from a stable hash of (seed, group) and the kind's fractions, so the records of one group
(a sequence, a patient) never cross splits. Shards hold records of one split, groups kept
together and in order, cut at about ``shard_size_mb`` (at a group boundary unless one group alone
is bigger). One pack task per shard reads its records one by one (memory: one shard), so any
``--jobs`` and backend give the same bytes.
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
from pipeline.errors import SourceError
from pipeline.fingerprint import fingerprint
from pipeline.incremental import plugin_digest
from pipeline.model import Kind, KindPlan, PackResult, PlanContext, ScannedSource, ShardPlan, Task
from pipeline.record_columns import RecordColumns
from pipeline.seeding import stable_unit
from pipeline.shardfile import finish_shard

if TYPE_CHECKING:
    from pipeline.manifest import Manifest, SourceSpec
    from pipeline.model import PackConfig, ScannedSource

log = logging.getLogger(__name__)
SPLIT_NAMES = ("train", "val", "test")


class SkipRecord(Exception):
    """Raised by ``read_record``: leave this record out, counted under ``reason`` (a short, stable
    phrase)."""

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
        """The records of one source (metadata only); raise SourceError naming the file on bad
        input."""

    @abstractmethod
    def schema(
        self, manifest: Manifest, scanned: Sequence[ScannedSource]
    ) -> tuple[fmt.FieldSpec, ...]:
        """The record fields (``sample_id`` is filled in by the base class when listed)."""

    @abstractmethod
    def read_record(
        self, manifest: Manifest, spec: SourceSpec, record: Record
    ) -> tuple[dict[str, np.ndarray], Any]:
        """One record's values by field name (dense: ``shape``; ragged: ``[k, *shape]``) and its
        JSON-able metadata; ``raise SkipRecord(reason)`` to leave it out (counted)."""

    def tables(self, manifest: Manifest) -> tuple[str, ...]:
        return ()

    def shard_tables(self, manifest: Manifest, records: Sequence[Record]) -> dict[str, np.ndarray]:
        """Tables of local row ids for a shard whose kept records are ``records`` (in shard order)."""
        return {}

    def fractions(self, config: Any) -> tuple[float, float]:
        """(val, test) fractions of groups drawn into those splits when the layout does not fix
        them."""
        return float(getattr(config, "val_fraction", 0.1)), float(
            getattr(config, "test_fraction", 0.1)
        )

    def section(self, manifest: Manifest) -> dict[str, Any]:
        """The kind's settings as stored in ``index.json`` (``sections[kind]``)."""
        return {}

    def describe(self, index: fmt.Index) -> dict[str, Any]:
        """What ``inspect`` says of any record kind: records found by the scan and groups per split
        (the splits' independence at a glance); subclasses add their own facts."""
        return {
            "records scanned": index.stats.get("records"),
            "groups per split": index.stats.get("groups_per_split"),
        }

    def describe_lines(self, summary: Mapping[str, Any]) -> list[str]:
        groups = summary.get("groups per split") or {}
        lines = [
            f"  records scanned: {summary.get('records scanned')}; groups per split: "
            + (", ".join(f"{k}={v}" for k, v in groups.items()) or "-")
        ]
        return lines + [
            f"  {k}: {v}"
            for k, v in summary.items()
            if k not in ("records scanned", "groups per split")
        ]

    def prepare(
        self, manifest: Manifest, records: list[tuple[int, Record]]
    ) -> list[tuple[int, Record]]:
        """All (source ordinal, record) pairs before planning: a hook for dataset-wide facts (e.g. a
        sequence vocabulary added to each record's ``info``). The default keeps them as they are."""
        return records

    # -- the inherited machinery
    # ---------------------------------------------------------------------
    def scan(
        self,
        manifest: Manifest,
        cache: Mapping[str, Mapping[str, object]] | None,
        hasher: Executor | None,
    ) -> list[ScannedSource]:

        out = []
        for i, spec in enumerate(manifest.sources):
            records = self.scan_source(manifest, spec)
            extra = self.source_companions(manifest, spec)
            pending = (
                fingerprint(spec.path, cache, extra)
                if hasher is None
                else hasher.submit(fingerprint, spec.path, cache, extra)
            )
            out.append(ScannedSource(i, spec, pending, records, {}))
        return out

    def plan(
        self, manifest: Manifest, scanned: Sequence[ScannedSource], ctx: PlanContext
    ) -> KindPlan:

        flat = self.prepare(manifest, [(s.ordinal, r) for s in scanned for r in s.meta])
        val, test = self.fractions(manifest.config)
        cap = manifest.shard_size_mb * (1 << 20)
        by_split: dict[str, list[int]] = {n: [] for n in SPLIT_NAMES}
        for number, (src, rec) in enumerate(flat):
            split = rec.split
            if split is None:
                u = stable_unit(manifest.seed, self.name, rec.group)
                split = "test" if u < test else "val" if u < test + val else "train"
            if split not in by_split:
                raise SourceError(
                    scanned[src].spec.path,
                    f"record {rec.index} (group {rec.group!r}): split {split!r} "
                    f"is not one of {SPLIT_NAMES}",
                )
            by_split[split].append(number)
        fields, tables = self.schema(manifest, scanned), self.tables(manifest)
        code = (ctx.salt, plugin_digest(manifest.plugins, self))
        shards: list[ShardPlan] = []
        for split, numbers in by_split.items():
            numbers.sort(
                key=lambda k: (flat[k][1].group, flat[k][1].order, flat[k][0], flat[k][1].index)
            )
            for part, members in enumerate(_cut(numbers, [flat[k][1] for k in numbers], cap)):
                rows = np.asarray(members, np.int64)
                sources = {flat[k][0] for k in members}
                shard = ShardPlan(split, sources.pop() if len(sources) == 1 else -1, part, rows, {})
                shard.key = self._key(manifest, scanned, flat, rows, fields, tables, code)
                shards.append(shard)
        groups = {n: len({flat[k][1].group for k in v}) for n, v in by_split.items()}
        stats = {
            "records": len(flat),
            "records_per_split": {n: len(v) for n, v in by_split.items()},
            "groups_per_split": groups,
        }
        return KindPlan(
            shards=shards,
            fields=fields,
            tables=tables,
            section=self.section(manifest),
            stats=stats,
            extra=flat,
        )

    def _key(
        self,
        manifest: Manifest,
        scanned: Sequence[ScannedSource],
        flat: list[tuple[int, Record]],
        rows: np.ndarray,
        fields: Sequence[fmt.FieldSpec],
        tables: Sequence[str],
        code: Sequence[str],
    ) -> str:
        """Everything a shard's bytes depend on: format, encoding, codec, the kind's settings (the
        manifest's sections of this kind), the schema, each record's source content and identity,
        and the code: the values come from ``read_record`` at pack time, so unlike a perturbation
        shard (whose planned columns are hashed) only the code can vouch for them: ``code`` holds
        the pipeline's code digest and that of the plug-in modules (the kind's own module when it
        lives outside the pipeline)."""
        h = hashlib.sha256()
        doc = {
            "format": fmt.SHARD_VERSION,
            "kind": self.name,
            "encoding": manifest.format,
            "codec": [manifest.codec, manifest.codec_level],
            "seed": manifest.seed,
            "sections": {k: manifest.raw.get(k) for k in self.sections},
            "fields": [f.to_json() for f in fields],
            "tables": list(tables),
            "code": list(code),
        }
        h.update(json.dumps(doc, sort_keys=True, default=str).encode())
        for k in rows.tolist():
            src, rec = flat[k]
            h.update(
                json.dumps(
                    [
                        k,
                        scanned[src].fingerprint.digest,
                        rec.index,
                        rec.group,
                        list(rec.order),
                        dict(rec.info),
                    ],
                    sort_keys=True,
                    default=str,
                ).encode()
            )
        return h.hexdigest()

    def pack_tasks(
        self,
        manifest: Manifest,
        plan: KindPlan,
        scanned: Sequence[ScannedSource],
        todo: Sequence[int],
        cfg: PackConfig,
    ) -> tuple[list[Task], list[Task]]:
        specs = [s.spec for s in scanned]
        return [], [
            partial(self._pack_one, manifest, plan.shards[i], i, specs, plan.extra, cfg)
            for i in todo
        ]

    def _pack_one(
        self,
        manifest: Manifest,
        shard: ShardPlan,
        number: int,
        specs: Sequence[SourceSpec],
        flat: list[tuple[int, Record]],
        cfg: PackConfig,
    ) -> list[PackResult]:
        """Read the shard's records one at a time into its columns (memory: about one shard),
        skipping (and counting) those ``read_record`` refuses, then validate, write, hash and
        count units."""

        columns = RecordColumns(cfg.fields, shard.n)
        kept: list[Record] = []
        metas: list[Any] = []
        skipped: dict[str, int] = {}
        for k in shard.rows.tolist():
            src, rec = flat[k]
            try:
                values, meta = self.read_record(manifest, specs[src], rec)
            except SkipRecord as e:
                skipped[e.reason] = skipped.get(e.reason, 0) + 1
                log.warning(
                    "%s: record %s skipped: %s%s",
                    specs[src].path,
                    rec.index,
                    e.reason,
                    f" ({e.detail})" if e.detail else "",
                )
                continue
            columns.add(k, values, specs[src].path, f"record {rec.index} (kind {self.name})")
            kept.append(rec)
            metas.append(meta)
        out = columns.finish()
        out.update(self.shard_tables(manifest, kept))
        return [PackResult(number, finish_shard(out, shard, cfg), skipped, metas)]


def _cut(numbers: list[int], records: list[Record], cap: float) -> list[list[int]]:
    """Consecutive runs of about ``cap`` bytes, cut at group boundaries unless one group alone is
    bigger."""
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
