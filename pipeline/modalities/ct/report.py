"""The CT section of `shardsmith report`: per volume its shape, spacing, orientation, the fraction
of voxels the window and band kept and the points stored after ``max_points``, and the HU
histogram of the kept voxels (read from the shards' ``hu`` feature). The per-volume facts are the
index's own records, as ``inspect`` shows them."""

from __future__ import annotations

from typing import Any

import numpy as np

from loaders.modalities.ct.samples import KIND, POINTS, RECORDS
from pipeline.report import plots
from pipeline.report.model import Figure, ReportContext, Section, Table, Unavailable, figure

BINS = 80  # at most; at least 1 HU wide


def volumes(ctx: ReportContext) -> list[dict[str, Any]]:
    """Each volume's record with its split, in sample-id order."""
    by_shard = ctx.need(ctx.index.section(KIND), RECORDS, "per-volume records")
    split = {e.file: e.split for e in ctx.index.shards}
    recs = [{**r, "split": split.get(f, "-")} for f, rs in by_shard.items() for r in rs]
    return sorted(recs, key=lambda r: (r.get("sample_id") is None, r.get("sample_id") or 0))


def _fmt(v: Any) -> str:
    return "-" if v is None else "\u00d7".join(f"{float(x):.3g}" for x in v)


def per_volume(ctx: ReportContext) -> Figure:
    recs = volumes(ctx)
    rows = [
        [
            r.get("file"),
            r.get("format") or "npy",
            r["split"],
            _fmt(r.get("shape")),
            _fmt(r.get("spacing")),
            r.get("axes") or "as stored",
            int(r["voxels"]),
            round(int(r["kept"]) / max(int(r["voxels"]), 1), 4),
            int(r[POINTS]),
            int(r["kept"]) > int(r[POINTS]),
        ]
        for r in recs
    ]
    labels = [str(r.get("file")) for r in recs]
    return Figure(
        "volumes",
        "Per volume: geometry, kept voxels, stored points",
        data=recs,
        svg=plots.bars(labels, [100 * row[7] for row in rows], "% of voxels kept"),
        table=Table(
            [
                "file",
                "format",
                "split",
                "shape",
                "spacing (mm)",
                "orientation",
                "voxels",
                "kept fraction",
                "points stored",
                "subsampled",
            ],
            rows,
            flagged=[i for i, row in enumerate(rows) if row[9]],
        ),
        open_table=len(rows) <= 30,
        note=f"{len(recs)} volumes; orange rows were subsampled to max_points "
        f"({ctx.details.get('subsampled', 0)} of them). Geometry in RAS mm (docs/CT.md).",
    )


def hu_histogram(ctx: ReportContext) -> Figure:
    per_hu = np.zeros(1 << 16, np.int64)  # one count per int16 value, binned once at the end
    for _, cols in ctx.columns(["hu/values"]):
        v = cols["hu/values"]
        per_hu += np.bincount(v.astype(np.int64) + (1 << 15), minlength=1 << 16)
    used = np.flatnonzero(per_hu)
    if not used.size:
        raise Unavailable("no voxel was kept")
    lo, hi = int(used[0]) - (1 << 15), int(used[-1]) - (1 << 15) + 1
    edges = np.unique(np.linspace(lo, hi, BINS + 1).round().astype(np.int64))
    counts = np.add.reduceat(per_hu[(1 << 15) + lo : (1 << 15) + hi], edges[:-1] - lo)
    s = ctx.details.get("settings") or {}
    n = int(per_hu.sum())
    return Figure(
        "hu_histogram",
        "HU of the kept voxels",
        data={
            "edges": edges.tolist(),
            "voxels": counts.tolist(),
            "min": lo,
            "max": hi - 1,
            "points": n,
        },
        svg=plots.histogram(edges, counts, "Hounsfield units", "voxels", True),
        note=f"{n:,} stored points, HU {lo} .. {hi - 1}; window {s.get('window')} (level "
        f"{s.get('level')}, width {s.get('width')}), band {s.get('band')}.",
    )


def ct_section(ctx: ReportContext) -> Section:
    d = ctx.details
    return Section(
        "CT",
        [
            figure("volumes", "Per volume", lambda: per_volume(ctx)),
            figure("hu_histogram", "HU of the kept voxels", lambda: hu_histogram(ctx)),
        ],
        intro=f"{d.get('volumes')} volumes: {d.get('points', 0):,} points stored of "
        f"{d.get('voxels', 0):,} voxels ({100 * d.get('fraction_stored', 0):.2f}%).",
    )
