"""The ``perturbation`` kind: single-cell perturbation screens (scPerturb h5ad, STATE / cell-load
H5-CSR).

Its planner is :mod:`pipeline.modalities.perturbation.plan` (cell table, splits, condition table,
control pairing, sentences) and its pack is :mod:`pipeline.modalities.perturbation.pack` (every
source read once in row blocks, rows routed to their shards). This module is the glue that makes
them a kind: the manifest sections, the schema, what the index and ``inspect`` say, and the
referential checks ``verify`` adds (pairs join a control to a perturbed cell).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders import format as fmt
from pipeline.modalities.perturbation.config import (
    Fields,
    Pairing,
    PerturbationConfig,
    parse_sections,
)
from pipeline.modalities.perturbation.split_config import Split
from pipeline.model import Kind, KindPlan, PlanContext, PlanStream, Task, register_kind

if TYPE_CHECKING:
    from pipeline.manifest import Manifest
    from pipeline.modalities.perturbation.cells import CellTable
    from pipeline.modalities.perturbation.conditions import ConditionTable
    from pipeline.model import PackConfig, ScannedSource, ShardPlan

TABLES = (fmt.PAIRS, fmt.SENTENCES_PERT, fmt.SENTENCES_CTRL)


@register_kind
class PerturbationKind(Kind):
    name = "perturbation"
    section_types = {"fields": Fields, "pairing": Pairing, "split": Split}
    samples = ("cells", "pairs", "sentences")
    # every planned column waits in a spill file until its shard is packed: the plan then holds only
    # a few bytes per cell (source rows) however many cells there are (the peak is then in planning:
    # BENCHMARKS.md)
    parked = (*TABLES, fmt.SAMPLE_ID, fmt.PRIMARY, fmt.COND_ID, fmt.OBS_PREFIX, fmt.OBS_NAMES + "/")
    resumable = True  # pipeline.resume: a failed build's finished shards are read back, not rebuilt

    def parse(self, path: Path, sections: Mapping[str, Any]) -> PerturbationConfig:
        return parse_sections(path, sections)

    def source_defaults(self, config: PerturbationConfig) -> dict[str, Any]:
        return {"matrix": config.fields.matrix}

    def input_files(self, manifest: Manifest) -> list[Path]:
        features = manifest.config.fields.perturbation_features
        experiment = manifest.config.split.experiment
        return ([features] if features is not None else []) + (
            [experiment.path] if experiment is not None else []
        )

    def scan(
        self,
        manifest: Manifest,
        cache: Mapping[str, Mapping[str, object]] | None,
        hasher: Executor | None,
    ) -> list[ScannedSource]:
        from pipeline.modalities.perturbation.scan import (
            scan,
        )  # import weight: h5py, paid by builds only

        return scan(manifest, cache, hasher)

    def plan(
        self, manifest: Manifest, scanned: Sequence[ScannedSource], ctx: PlanContext
    ) -> KindPlan:
        from pipeline.modalities.perturbation.plan import (
            make_plan,
        )  # import weight: paid by builds only

        plan = make_plan(manifest, scanned, park=ctx.park, known=ctx.known, salt=ctx.salt)
        out = self._kind_plan(manifest, scanned, plan.cells, plan.conditions, plan.shards)
        out.stats = self._stats(plan.stats, scanned, len(plan.cells))
        out.source_keys, out.source_stats = plan.source_keys, plan.source_stats
        return out

    def plan_stream(
        self, manifest: Manifest, scanned: Sequence[ScannedSource], ctx: PlanContext
    ) -> PlanStream:
        """The same plan, one source at a time: a source's shards depend on the dataset-wide
        tables and on that source only (module plan), so each can be packed while the next is
        planned."""
        from pipeline.modalities.perturbation.plan import (
            plan_sources,
            plan_stats,
            plan_tables,
        )  # import weight: paid by builds only

        tables = plan_tables(manifest, scanned)
        plan = self._kind_plan(manifest, scanned, tables.cells, tables.cond, [])

        def sources() -> Iterator[range]:
            steps = plan_sources(manifest, scanned, tables, ctx.park, ctx.known, ctx.salt)
            for key, shards, stats in steps:
                first = len(plan.shards)
                plan.shards.extend(shards)
                plan.source_keys.append(key)
                plan.source_stats.append(stats)
                yield range(first, len(plan.shards))
            totals = plan_stats(tables, plan.source_stats)
            plan.stats = self._stats(totals, scanned, len(tables.cells))

        return PlanStream(plan, sources())

    @staticmethod
    def _stats(
        stats: Mapping[str, Any], scanned: Sequence[ScannedSource], cells: int
    ) -> dict[str, Any]:
        return {
            **stats,
            "source_rows": int(sum(s.meta.n_rows for s in scanned)),
            "cells": cells,
        }

    def _kind_plan(
        self,
        manifest: Manifest,
        scanned: Sequence[ScannedSource],
        cells: CellTable,
        cond: ConditionTable,
        shards: list[ShardPlan],
    ) -> KindPlan:
        """The plan as the build takes it, less its stats and per-source keys."""
        cfg = manifest.config
        vocab = cells.vocabularies
        return KindPlan(
            shards=shards,
            fields=self.schema(manifest, scanned, vocab, int(cond.vectors.shape[0])),
            tables=TABLES,
            conditions={fmt.CONDITION_VECTORS: cond.vectors, fmt.CONDITION_CODES: cond.codes},
            condition_segments=list(cond.segments),
            vocabularies=vocab,
            obs_fields=list(cfg.fields.obs_fields),
            control_labels=[c for c in cfg.fields.control if c in vocab["perturbation"]],
            section={
                "pairing": {
                    "strategy": cfg.pairing.strategy,
                    "sentence_size": cfg.pairing.sentence_size,
                    "max_pairs_per_condition": cfg.pairing.max_pairs_per_condition,
                },
                "split": split_section(cfg.split),
                "var_names": list(scanned[0].meta.var_names),
            },
            primary_records=len(cells),
        )

    def schema(
        self,
        manifest: Manifest,
        scanned: Sequence[ScannedSource],
        vocab: Mapping[str, list[str]],
        n_cond: int,
    ) -> tuple[fmt.FieldSpec, ...]:
        first, cfg = scanned[0].meta, manifest.config
        out = [
            fmt.FieldSpec(fmt.X, "csr", "float32", (first.n_cols,)),
            fmt.FieldSpec(fmt.SAMPLE_ID, "dense", "int64"),
            fmt.FieldSpec(fmt.PRIMARY, "dense", "bool"),
            fmt.FieldSpec(fmt.COND_ID, "dense", "int32", bound=n_cond),
        ]
        if getattr(
            scanned[0], "has_obs_names", False
        ):  # cell barcodes, for export and obs_names_for
            out.append(fmt.FieldSpec(fmt.OBS_NAMES, "ragged", "uint8"))
        out += [
            fmt.FieldSpec(fmt.OBS_PREFIX + f, "dense", "int32", bound=len(vocab[f]))
            for f in cfg.fields.obs_fields
        ]
        out += [
            fmt.FieldSpec(fmt.OBSM_PREFIX + k, "dense", "float32", tuple(first.obsm[k][0][1:]))
            for k in cfg.fields.obsm
        ]
        return tuple(out)

    def pack_tasks(
        self,
        manifest: Manifest,
        plan: KindPlan,
        scanned: Sequence[ScannedSource],
        todo: Sequence[int],
        cfg: PackConfig,
    ) -> tuple[list[Task], list[Task]]:
        from pipeline.modalities.perturbation.pack import (
            pack_tasks,
        )  # import weight: scipy/numcodecs, builds only

        tasks = pack_tasks(plan.shards, scanned, todo, cfg)
        for src in scanned:  # the plan is final: every cell's obs codes (kept for a re-plan) can go
            src.obs.clear()
        return tasks  # type: ignore[return-value]

    def pack_options(self, manifest: Manifest) -> Any:
        """The matrix-specific settings of the pack (and its memory budget, read now)."""
        from pipeline.modalities.perturbation.pack import (
            pack_options,
        )  # its h5py/scipy are the pack's

        return pack_options(manifest.config.fields.values == "counts", manifest.config.fields.obsm)

    def check_shard(self, index: fmt.Index, columns: Mapping[str, np.ndarray]) -> list[str]:
        problems = []
        pert_vocab = index.vocabularies.get("perturbation", [])
        codes = columns.get(fmt.OBS_PREFIX + "perturbation", np.zeros(0, np.int32))
        is_ctrl = np.isin(
            codes, [pert_vocab.index(c) for c in index.control_labels if c in pert_vocab]
        )
        pairs = columns.get(fmt.PAIRS, np.zeros((0, 2), np.int32))
        if pairs.size and not (is_ctrl[pairs[:, 0]].all() and not is_ctrl[pairs[:, 1]].any()):
            problems.append("a pair does not join a control to a perturbed cell")
        ctrl = columns.get(fmt.SENTENCES_CTRL, np.zeros((0, 1), np.int32))
        if ctrl.size and not is_ctrl[ctrl].all():
            problems.append("a control sentence holds a perturbed cell")
        return problems

    def describe(self, index: fmt.Index) -> dict[str, Any]:
        stats = index.stats
        return {
            "genes": index.field(fmt.X).shape[0] if index.has_field(fmt.X) else None,
            "conditions": index.conditions.rows if index.conditions is not None else None,
            "pairing": stats.get("pairing", {}),
            "dropped": stats.get("dropped", {}),
            "source_rows": stats.get("source_rows"),
        }

    def warnings(self, index: fmt.Index) -> list[str]:
        size = index.sections.get(self.name, {}).get("pairing", {}).get("sentence_size")
        return plan_warnings(index.stats, size)

    def describe_lines(self, summary: Mapping[str, Any]) -> list[str]:
        lines = [
            f"  genes: {summary.get('genes')}, conditions: {summary.get('conditions')}, "
            f"source rows: {summary.get('source_rows')}"
        ]
        lines.append(
            "  pairing: " + ", ".join(f"{k}={v}" for k, v in summary.get("pairing", {}).items())
        )
        if summary.get("dropped"):
            lines.append(
                "  dropped: " + ", ".join(f"{k}={v}" for k, v in summary["dropped"].items())
            )
        return lines


def _fallbacks(counts: Mapping[str, Any], prefix: str) -> tuple[int, int, str]:
    """(beyond exact, total, "level=n, ...") for the pairs_* or sentence_slots_* counts."""
    levels = {k.removeprefix(prefix): int(v) for k, v in counts.items() if k.startswith(prefix)}
    beyond = {k: v for k, v in levels.items() if k != "exact" and v}
    return (
        sum(beyond.values()),
        sum(levels.values()),
        ", ".join(f"{k}={v}" for k, v in beyond.items()),
    )


def plan_warnings(stats: Mapping[str, Any], sentence_size: int | None) -> list[str]:
    """The counted weak spots of a perturbation build: controls matched beyond the requested level,
    splits with cells but no pairs or sentences, perturbation groups shorter than a sentence."""
    out = []
    pairing, checks = stats.get("pairing", {}), stats.get("checks", {})
    for prefix, what in (("pairs_", "pairs"), ("sentence_slots_", "sentence slots")):
        beyond, total, detail = _fallbacks(pairing, prefix)
        if beyond:
            out.append(
                f"{beyond} of {total} {what} took a control beyond the exact level ({detail}): "
                "see docs/PIPELINE.md, Matching"
            )
    for split, cells in stats.get("cells_per_split", {}).items():
        for what in ("pairs", "sentences"):
            if cells and f"{what}_{split}" in checks and not checks[f"{what}_{split}"]:
                out.append(
                    f"split {split!r} has {cells} cells but no {what} (only controls, or no perturbed cells)"
                )
    short, groups = checks.get("short_perturbation_groups", 0), checks.get("perturbation_groups", 0)
    if short:
        out.append(
            f"{short} of {groups} perturbations (per source, split and cell type) have fewer cells than "
            f"sentence_size = {sentence_size}: their sentences repeat cells"
        )
    return out


def split_section(split: Split) -> dict[str, Any]:
    """What index.json records of the ``[split]``: the first three keys, plus the later options only
    when used (an index built without them stays byte-identical)."""
    out: dict[str, Any] = {
        "mode": split.mode,
        "val_fraction": split.val_fraction,
        "test_fraction": split.test_fraction,
    }
    if split.controls != "heldout":
        out["controls"] = split.controls
    if split.combinations != "any":
        out["combinations"] = split.combinations
    if split.fewshot is not None:
        out["fewshot"] = {
            ct: {
                "val": list(e.val),
                "test": list(e.test),
                "val_fraction": e.val_fraction,
                "test_fraction": e.test_fraction,
            }
            for ct, e in sorted(split.fewshot.items())
        }
    if split.experiment is not None:
        out["cellload_toml"] = {
            "path": split.experiment.path.name,
            "sha256": split.experiment.sha256,
        }
    return out
