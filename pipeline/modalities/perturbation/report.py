"""The perturbation section of `shardsmith report`: cells per perturbation (those in a group shorter
than a sentence flagged), cells per split x cell type with the held-out groups named, pairs and
sentence slots by fallback level, the condition vector, dropped records.

Counts of cells are read from the shards' primary rows (``obs/*`` codes, a few bytes per cell);
the pairing, dropped and split totals are the ``inspect`` summary's own numbers."""

from __future__ import annotations

from typing import Any

import numpy as np

from loaders import format as fmt
from pipeline.report import plots
from pipeline.report.model import (
    Figure,
    ReportContext,
    Section,
    Table,
    Unavailable,
    figure,
    splits_in_order,
)

LEVELS = ("exact", "cell_type", "source", "split")  # pairing fallbacks, nearest match first
PERT, CELL_TYPE = fmt.OBS_PREFIX + "perturbation", fmt.OBS_PREFIX + "cell_type"


def primary_cells(ctx: ReportContext) -> dict[str, np.ndarray]:
    """Every stored cell once (its primary row): perturbation and cell type codes (-1: the dataset
    has no cell type), split and source ordinal."""
    keys = [PERT, fmt.PRIMARY] + ([CELL_TYPE] if "cell_type" in ctx.index.obs_fields else [])
    parts: dict[str, list[np.ndarray]] = {"pert": [], "cell_type": [], "split": [], "source": []}
    splits = splits_in_order(e.split for e in ctx.index.shards)
    for entry, cols in ctx.columns(keys):
        keep = cols[fmt.PRIMARY].astype(bool)
        n = int(keep.sum())
        parts["pert"].append(cols[PERT][keep])
        parts["cell_type"].append(cols[CELL_TYPE][keep] if CELL_TYPE in cols else np.full(n, -1))
        parts["split"].append(np.full(n, splits.index(entry.split)))
        parts["source"].append(np.full(n, entry.source))
    out = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in parts.items()}
    out["split_names"] = np.array(splits, dtype=object)
    return out


def perturbation_groups(
    ctx: ReportContext, cells: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """The groups sentences are drawn from, as the build counts them (plan.group_checks): perturbed
    cells per (source, split, cell type, perturbation). Returns each group's perturbation code and
    size; one int64 key per cell, sorted once (unique over rows sorts 4 columns: 20x slower)."""
    if "group_pert" not in cells:
        names = ctx.index.vocabularies.get("perturbation") or []
        ctrl = [names.index(c) for c in ctx.index.control_labels if c in names]
        perturbed = ~np.isin(cells["pert"], ctrl)
        key = np.zeros(int(perturbed.sum()), np.int64)
        for k in ("source", "split", "cell_type", "pert"):
            col = cells[k][perturbed].astype(np.int64) + 1  # cell_type -1: none
            key = key * (int(col.max(initial=0)) + 1) + col
        _, first, sizes = np.unique(key, return_index=True, return_counts=True)
        cells["group_pert"] = cells["pert"][perturbed][first].astype(np.int64)
        cells["group_sizes"] = sizes
    return cells["group_pert"], cells["group_sizes"]


def cells_per_perturbation(ctx: ReportContext, cells: dict[str, np.ndarray]) -> Figure:
    names = ctx.index.vocabularies.get("perturbation") or []
    if not names:
        raise Unavailable("this dataset has no perturbation vocabulary")
    size = ctx.index.sections.get("perturbation", {}).get("pairing", {}).get("sentence_size")
    counts = np.bincount(cells["pert"], minlength=len(names))
    controls = set(ctx.index.control_labels)
    # groups as the build counts them (plan.group_checks): per source, split, cell type, perturbation
    group_pert, group_sizes = perturbation_groups(ctx, cells)
    groups = group_pert
    short = group_pert[group_sizes < size] if size else np.zeros(0, np.int64)
    short_by_pert = np.bincount(short, minlength=len(names))
    flagged = {names[i] for i in np.flatnonzero(short_by_pert)}
    order = np.argsort(-counts, kind="stable")
    rows = [
        [names[i], int(counts[i]), "control" if names[i] in controls else "", int(short_by_pert[i])]
        for i in order
    ]
    data = {
        "cells": {names[i]: int(counts[i]) for i in range(len(names))},
        "sentence_size": size,
        "groups": int(len(groups)),
        "short_groups": int(len(short)),
        "short_groups_by_perturbation": {
            names[i]: int(short_by_pert[i]) for i in np.flatnonzero(short_by_pert)
        },
    }
    shown = [names.index(n) for n in names if n not in controls]
    splits = list(cells["split_names"])
    by_split = np.zeros((len(splits), len(names)), np.int64)
    np.add.at(by_split, (cells["split"], cells["pert"]), 1)
    chart = (
        plots.sorted_bars(
            [names[i] for i in shown],
            {s: by_split[k, shown] for k, s in enumerate(splits)},
            "cells (primary rows)",
            flagged,
            f"a (source, split, cell type) group has < {size} cells",
        )
        if len(shown) <= 400
        else plots.histogram(*_hist(counts), "cells per perturbation", "perturbations", False)
    )
    return Figure(
        "cells_per_perturbation",
        "Cells per perturbation",
        data=data,
        svg=chart,
        table=Table(
            ["perturbation", "cells", "", f"groups < {size} cells"],
            rows,
            flagged=[i for i, r in enumerate(rows) if r[3]],
        ),
        open_table=len(rows) <= 20,
        note=f"{len(names)} perturbations ({len(controls & set(names))} control label(s), not "
        f"charted), cells stacked by split. Red names: {len(flagged)} perturbations with at least one (source, split, cell "
        f"type) group shorter than sentence_size = {size}: {len(short)} of {len(groups)} groups; "
        "their sentences repeat cells.",
    )


def group_sizes(ctx: ReportContext, cells: dict[str, np.ndarray]) -> Figure:
    """The sizes of the groups sentences are drawn from, against sentence_size."""
    size = ctx.index.sections.get("perturbation", {}).get("pairing", {}).get("sentence_size")
    sizes = perturbation_groups(ctx, cells)[1]
    if not sizes.size:
        raise Unavailable("this dataset holds no perturbed cells")
    hi = int(max(sizes.max(), size or 0)) + 1
    counts, edges = np.histogram(sizes, bins=min(60, hi), range=(0, hi))
    return Figure(
        "group_sizes",
        "Cells per (source, split, cell type, perturbation) group",
        data={"edges": edges.tolist(), "groups": counts.tolist(), "sentence_size": size},
        svg=plots.histogram(edges, counts, "cells in the group", "groups", False, line=size),
        note=f"dashed: sentence_size = {size}; {int((sizes < (size or 0)).sum())} of {sizes.size} "
        "groups lie left of it.",
    )


def _hist(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c, edges = np.histogram(counts, bins=40)
    return edges, c


def split_by_cell_type(ctx: ReportContext, cells: dict[str, np.ndarray]) -> Figure:
    types = ctx.index.vocabularies.get("cell_type")
    if not types:
        raise Unavailable("this dataset records no cell type (manifest [fields] cell_type)")
    splits = list(cells["split_names"])
    grid = np.zeros((len(types), len(splits)), np.int64)
    np.add.at(grid, (cells["cell_type"], cells["split"]), 1)
    train = splits.index("train") if "train" in splits else None
    names = ctx.index.vocabularies.get("perturbation") or []
    # held out: no perturbed cell in train (a zero-shot split may keep their controls there)
    ctrl = np.isin(cells["pert"], [names.index(c) for c in ctx.index.control_labels if c in names])
    in_train = np.zeros(len(types), bool)
    if train is not None:
        in_train[np.unique(cells["cell_type"][(cells["split"] == train) & ~ctrl])] = True
    held = [
        t for i, t in enumerate(types) if train is not None and not in_train[i] and grid[i].sum()
    ]
    seen = np.zeros(len(names), bool)
    if train is not None:
        seen[np.unique(cells["pert"][cells["split"] == train])] = True
    present = np.zeros(len(names), bool)
    present[np.unique(cells["pert"])] = True
    unseen = [names[i] for i in np.flatnonzero(present & ~seen)]
    mode = ctx.index.sections.get("perturbation", {}).get("split", {})
    rows = [
        [t, *(int(x) for x in grid[i]), "held out of train" if t in held else ""]
        for i, t in enumerate(types)
    ]
    return Figure(
        "split_by_cell_type",
        "Cells per split x cell type",
        data={
            "splits": splits,
            "cell_types": list(types),
            "cells": grid.tolist(),
            "held_out_cell_types": held,
            "perturbations_not_in_train": unseen,
            "split_config": mode,
        },
        table=Table(
            ["cell type", *splits, ""],
            rows,
            flagged=[i for i, t in enumerate(types) if t in held],
            shade=True,
        ),
        note=f"split mode {mode.get('mode', '-')}; held out of train: cell types "
        f"{', '.join(held) or 'none'}; perturbations {', '.join(unseen) or 'none'}.",
    )


def pairing(ctx: ReportContext) -> Figure:
    counts = ctx.need(ctx.details, "pairing", "pairing provenance")
    rows, data = [], {}
    for prefix, what in (("pairs_", "pairs"), ("sentence_slots_", "sentence slots")):
        by_level = {lv: int(counts.get(prefix + lv, 0)) for lv in LEVELS}
        if not any(prefix + lv in counts for lv in LEVELS):
            raise ctx.unrecorded(f"{what} by fallback level")
        data[what] = by_level
        rows.append([what, *by_level.values(), sum(by_level.values())])
    data["duplicated_controls"] = counts.get("duplicated_controls")
    return Figure(
        "pairing",
        "Pairing provenance: the level each control was matched at",
        data=data,
        svg=plots.stacked_levels(list(data)[:2], LEVELS, [r[1:5] for r in rows], "fraction"),
        table=Table(["", *LEVELS, "total"], rows),
        note="exact: same batch (or the strategy's key), cell type, source and split; each later "
        "level is a coarser fallback (docs/PIPELINE.md, Matching).",
    )


def conditions(ctx: ReportContext) -> Figure:
    cond = ctx.need(ctx.index.raw, "conditions", "a condition table")
    segs = cond.get("segments") or []
    return Figure(
        "conditions",
        f"Condition vector: {cond.get('dim')} values per condition, {cond.get('rows')} conditions",
        data={"dim": cond.get("dim"), "rows": cond.get("rows"), "segments": segs},
        table=Table(
            ["field", "encoding", "offset", "size"],
            [[s.get("field"), s.get("encoding"), s.get("offset"), s.get("size")] for s in segs],
        ),
    )


def dropped(ctx: ReportContext) -> Figure:
    d: dict[str, Any] = dict(ctx.details.get("dropped") or {})
    return Figure(
        "dropped",
        "Dropped records by reason",
        data=d,
        note=f"none ({ctx.details.get('source_rows')} source rows, all stored)" if not d else "",
        table=Table(["reason", "records"], [[k, v] for k, v in d.items()]) if d else None,
    )


def perturbation_section(ctx: ReportContext) -> Section:
    try:
        cells: dict[str, np.ndarray] | None = primary_cells(ctx)
    except Unavailable:
        cells = None

    def with_cells(fn: Any) -> Any:
        def build() -> Figure:
            if cells is None:
                raise Unavailable("this dataset stores no obs/perturbation column")
            return fn(ctx, cells)

        return build

    return Section(
        "Perturbation",
        [
            figure(
                "cells_per_perturbation",
                "Cells per perturbation",
                with_cells(cells_per_perturbation),
            ),
            figure("group_sizes", "Group sizes", with_cells(group_sizes)),
            figure(
                "split_by_cell_type", "Cells per split x cell type", with_cells(split_by_cell_type)
            ),
            figure("pairing", "Pairing provenance", lambda: pairing(ctx)),
            figure("conditions", "Condition vector", lambda: conditions(ctx)),
            figure("dropped", "Dropped records by reason", lambda: dropped(ctx)),
        ],
        intro=f"{ctx.details.get('genes')} genes, {ctx.details.get('source_rows')} source rows.",
    )
