"""The report's plots: matplotlib figures saved as inline SVG (text kept as text, so a page names
what its charts show and a browser's find works on them).

Why matplotlib SVG: the page must be offline and small. An SVG chart is a few to a few tens of kB
with no script; plotly embeds ~3.5 MB of JavaScript per page, altair needs vl-convert for static
output. matplotlib is already a dependency of the benchmarks (the ``report`` extra); it is imported
here only, with no pyplot (no global state, no GUI backend).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

matplotlib.rcParams.update(
    {
        "svg.fonttype": "none",  # text as <text>: smaller, searchable
        "svg.hashsalt": "shardsmith",  # stable element ids: the same data gives the same page
        "font.size": 9,
        "axes.spines.top": False,
        "axes.spines.right": False,
    }
)
BLUE, ORANGE, GREY, RED = "#3b75af", "#e1812c", "#9a9a9a", "#c03d3e"
PART_COLOURS = (BLUE, "#8fbbd9", ORANGE, GREY)  # train, val, test, other
LEVEL_COLOURS = {
    "exact": "#3b75af",
    "cell_type": "#8fbbd9",
    "source": "#e1812c",
    "split": "#c03d3e",
}


def svg(fig: Figure) -> str:
    """The figure as an ``<svg>`` element (no XML prolog, no date): ready to inline."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def sorted_bars(
    labels: Sequence[str],
    parts: Mapping[str, Sequence[float]],
    xlabel: str,
    flagged: set[str] = frozenset(),  # type: ignore[assignment]
    flag_label: str = "",
) -> str:
    """Horizontal bars, largest total first, each stacked by its ``parts`` (e.g. cells per split);
    ``flagged`` labels are drawn red with ``flag_label`` in the legend."""
    stack = np.array([list(v) for v in parts.values()], dtype=float).reshape(len(parts), -1)
    order = np.argsort(-stack.sum(0), kind="stable")
    names = [labels[i] for i in order]
    fig = Figure(figsize=(6.5, 0.8 + 0.15 * len(names)))
    ax = fig.add_subplot()
    left = np.zeros(len(names))
    for k, (part, colour) in enumerate(zip(parts, PART_COLOURS, strict=False)):
        ax.barh(
            range(len(names)), stack[k, order], left=left, color=colour, height=0.75, label=part
        )
        left += stack[k, order]
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for tick, name in zip(ax.get_yticklabels(), names, strict=True):
        if name in flagged:
            tick.set_color(RED)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlabel(xlabel)
    title = f"red names: {flag_label}" if flagged else None
    ax.legend(loc="lower right", frameon=False, title=title, title_fontsize=7)
    return svg(fig)


def stacked_levels(
    rows: Sequence[str], levels: Sequence[str], counts: Sequence[Sequence[int]], xlabel: str
) -> str:
    """One horizontal bar per row, split into its counts per level (fractions of the row)."""
    fig = Figure(figsize=(6.5, 0.5 + 0.45 * len(rows)))
    ax = fig.add_subplot()
    totals = [max(sum(c), 1) for c in counts]
    left = np.zeros(len(rows))
    for j, level in enumerate(levels):
        frac = np.array([c[j] / t for c, t in zip(counts, totals, strict=True)])
        ax.barh(rows, frac, left=left, color=LEVEL_COLOURS.get(level, GREY), label=level)
        left += frac
    ax.set_xlim(0, 1)
    ax.set_xlabel(xlabel)
    ax.invert_yaxis()
    ax.legend(ncols=len(levels), loc="upper center", bbox_to_anchor=(0.5, -0.35), frameon=False)
    return svg(fig)


def histogram(
    edges: np.ndarray,
    counts: np.ndarray,
    xlabel: str,
    ylabel: str,
    log: bool,
    line: float | None = None,
) -> str:
    """Bars over ``edges`` (len(counts) + 1); ``line``: a dashed threshold."""
    fig = Figure(figsize=(6.5, 2.6))
    ax = fig.add_subplot()
    ax.stairs(counts, edges, fill=True, color=BLUE)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if log and np.any(counts > 0):
        ax.set_yscale("log")
    if line is not None:
        ax.axvline(line, color="#444", linestyle="--", linewidth=0.8)
    return svg(fig)


def bars(labels: Sequence[str], values: Sequence[float], ylabel: str, **kw: Any) -> str:
    """Vertical bars in the given order (one per file, volume, split)."""
    fig = Figure(figsize=(kw.get("width", 6.5), kw.get("height", 2.6)))
    ax = fig.add_subplot()
    ax.bar(range(len(labels)), values, color=kw.get("colours") or BLUE)
    ax.set_xticks(
        range(len(labels)),
        labels,
        rotation=60 if len(labels) > 6 else 0,
        ha="right" if len(labels) > 6 else "center",
        fontsize=7,
    )
    ax.set_ylabel(ylabel)
    if kw.get("line") is not None:
        ax.axhline(kw["line"], color="#444", linestyle="--", linewidth=0.8)
    return svg(fig)


def images(panels: Sequence[tuple[str, np.ndarray]], cmap: str = "gray") -> str:
    """Images side by side, each with its title (a mean frame at its declared resolution)."""
    fig = Figure(figsize=(3.2 * len(panels), 2.6))
    for i, (title, img) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        ax.imshow(img, cmap=cmap, interpolation="nearest", aspect="auto")
        ax.set_title(title, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    return svg(fig)
