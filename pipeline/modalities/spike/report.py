"""The spike section of `shardsmith report`: per file its stored frames, resolution and spike rate
(spikes per pixel per frame), and the resolution check's figure: the mean frame at the declared
resolution, with the neighbouring-row correlation the build's check (:mod:`.checks`) computes at
the declared width and at the widths it tries instead.

The rates and the mean frame are counted from the stored spike bits (the ``spikes`` column); the
frame counts and the build's hints are the index's own stats, as ``inspect`` shows them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from loaders.modalities.spike.ops import FRAME_MAJOR, PIXEL_MAJOR
from loaders.modalities.spike.samples import FRAME, SEQUENCE, SPIKES, bit_order, stored_frames
from pipeline.modalities.spike.checks import candidate_widths, row_correlation
from pipeline.report import plots
from pipeline.report.model import Figure, ReportContext, Section, Table, Unavailable, figure


def _pixel_major(bits: np.ndarray, frames: int, width: int) -> np.ndarray:
    return np.unpackbits(bits, axis=-1, bitorder="little")[..., :frames].sum(-1, dtype=np.int64)


def _frame_major(bits: np.ndarray, frames: int, width: int) -> np.ndarray:
    return np.unpackbits(bits, axis=-1, bitorder="little")[..., :width].sum(0, dtype=np.int64)


# bit order -> one record's stored bits to spikes per pixel [H, W]
PIXEL_COUNTS: dict[str, Callable[[np.ndarray, int, int], np.ndarray]] = {
    PIXEL_MAJOR: _pixel_major,
    FRAME_MAJOR: _frame_major,
}


def per_record(ctx: ReportContext) -> dict[str, Any]:
    """Each stored record (one .dat file's window): split, sequence, frame, file, spikes; and the
    sum over records of spikes per pixel."""
    sec = ctx.index.section("spike")
    height, width = int(ctx.need(sec, "height", "the resolution")), int(sec["width"])
    frames, order = stored_frames(ctx.index), bit_order(ctx.index)
    names = ctx.index.vocabularies.get(SEQUENCE) or []
    files = {
        (r.get("sequence"), int(r.get("frame", -1))): r.get("file")
        for rs in (sec.get("records") or {}).values()
        for r in rs
    }
    rows, total = [], np.zeros((height, width), np.int64)
    for entry, cols in ctx.columns([SPIKES, SEQUENCE, FRAME]):
        for i in range(cols[SPIKES].shape[0]):
            counts = PIXEL_COUNTS[order](cols[SPIKES][i], frames, width)
            total += counts
            seq = names[int(cols[SEQUENCE][i])] if names else str(int(cols[SEQUENCE][i]))
            frame = int(cols[FRAME][i])
            spikes = int(counts.sum())
            rows.append(
                [
                    entry.split,
                    seq,
                    files.get((seq, frame), "-"),
                    frame,
                    frames,
                    spikes,
                    spikes / (height * width * frames),
                ]
            )
    rows.sort(key=lambda r: (r[1], r[3]))
    return {
        "rows": rows,
        "mean_frame": total / max(len(rows) * frames, 1),
        "height": height,
        "width": width,
        "frames": frames,
        "flip_rows": bool(sec.get("flip_rows")),
    }


def per_file(ctx: ReportContext, rec: dict[str, Any]) -> Figure:
    rows = rec["rows"]
    rates = [r[6] for r in rows]
    facts = ctx.index.stats.get("frames_per_file")  # None: an index built before it was counted
    return Figure(
        "files",
        f"Per file: frames, resolution {rec['height']}x{rec['width']}, spike rate",
        data={
            "resolution": [rec["height"], rec["width"]],
            "frames_per_file": facts,
            "files": [
                dict(
                    zip(
                        ("split", "sequence", "file", "frame", "frames", "spikes", "rate"),
                        r,
                        strict=True,
                    )
                )
                for r in rows
            ],
        },
        svg=plots.bars([f"{r[1]}/{r[2]}" for r in rows], rates, "spikes per pixel per frame"),
        table=Table(
            [
                "split",
                "sequence",
                "file",
                "frame",
                "frames stored",
                "spikes",
                "spikes / pixel / frame",
            ],
            rows,
        ),
        open_table=len(rows) <= 20,
        note=f"{len(rows)} files; rate {min(rates, default=0):.4f} .. {max(rates, default=0):.4f}; "
        "frames per file in the sources: "
        + (
            f"{facts['min']}..{facts['max']} over {facts['files']} files"
            if facts
            else "not recorded by this dataset's index (built before it was counted)"
        ),
    )


def source_frames(ctx: ReportContext) -> Figure:
    """Frames per .dat file as the build counted them in the sources (before any window)."""
    facts = ctx.need(ctx.index.stats, "frames_per_file", "frames per source file")
    unequal = ctx.index.stats.get("sequences_with_unequal_frames") or []
    return Figure(
        "source_frames",
        "Frames per source file",
        data={**facts, "sequences_with_unequal_frames": unequal},
        table=Table(
            ["files", "fewest frames", "most frames", "sequences with unequal counts"],
            [[facts["files"], facts["min"], facts["max"], ", ".join(unequal) or "none"]],
        ),
    )


def resolution_check(ctx: ReportContext, rec: dict[str, Any]) -> Figure:
    """The build's resolution check, drawn: the mean frame as declared, the row correlation at the
    declared width and at each width the check tries."""
    h, w = rec["height"], rec["width"]
    mean = rec["mean_frame"][::-1] if rec["flip_rows"] else rec["mean_frame"]
    flat = mean.ravel()  # the file's pixel order: the check reads the raw frames
    widths = [w, *candidate_widths(h, w)]
    scores = {x: row_correlation(flat, x) for x in widths}
    hints = ctx.index.stats.get("resolution_hints") or []
    best = max(
        (x for x in widths[1:] if scores[x] == scores[x]), key=lambda x: scores[x], default=None
    )
    panels = [(f"declared {h}x{w}: r = {scores[w]:.2f}", rec["mean_frame"])]
    if best is not None:
        panels.append((f"as width {best}: r = {scores[best]:.2f}", flat.reshape(-1, best)))
    return Figure(
        "resolution_check",
        "Resolution check: the mean frame and its neighbouring-row correlation",
        data={
            "declared": [h, w],
            "row_correlation": {str(x): round(v, 4) for x, v in scores.items()},
            "build_hints": hints,
        },
        svg=plots.images(panels),
        table=Table(
            ["width", "row correlation", ""],
            [[x, round(v, 4), "declared" if x == w else ""] for x, v in scores.items()],
        ),
        note="A real scene's neighbouring rows correlate strongly at the true width only; the "
        f"build warns when the declared width falls below 0.5 and another reaches 0.8. Build "
        f"hints: {len(hints)}"
        + (
            f" ({hints[0]['file']}: better width {hints[0]['better_width']})"
            if hints
            else " (the declared resolution is consistent)."
        ),
    )


def spike_section(ctx: ReportContext) -> Section:
    try:
        rec: dict[str, Any] | None = per_record(ctx)
    except Unavailable:
        rec = None

    def with_records(fn: Callable[[ReportContext, dict[str, Any]], Figure]) -> Callable[[], Figure]:
        def build() -> Figure:
            if rec is None:
                raise Unavailable("this dataset's index does not record the spike resolution")
            return fn(ctx, rec)

        return build

    d = ctx.details
    return Section(
        "Spike",
        [
            figure("files", "Per file", with_records(per_file)),
            figure("source_frames", "Frames per source file", lambda: source_frames(ctx)),
            figure("resolution_check", "Resolution check", with_records(resolution_check)),
        ],
        intro=f"{d.get('sequences')} sequences, resolution {d.get('resolution')}, {d.get('frames')} "
        f"frames per stored window, {d.get('num_bins')} bins, clips of {d.get('clip_len')}.",
    )
