"""The report's plots, written as inline SVG by hand: bars, stacked bars, histograms and grey images.

Why no plotting library: `make bench` holds the report to 5% of the bench screen's build (~70 ms
of the build's 1.4 s), and matplotlib alone costs more than that to import (measured: 0.3 s on an
idle core, 2.8 s under this machine's load) and ~1 s to draw the demo screen's charts; plotly
embeds ~3.5 MB of JavaScript per page. These charts need rectangles, lines and text only: SVG
strings, a few kB each, in microseconds, with no dependency, the same bytes for the same data,
and labels kept as text (a page names what its charts show; find-in-page works on them).
"""

from __future__ import annotations

import base64
import html
import math
import struct
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

BLUE, ORANGE, GREY, RED = "#3b75af", "#e1812c", "#9a9a9a", "#c03d3e"
PART_COLOURS = (BLUE, "#8fbbd9", ORANGE, GREY)  # train, val, test, other
LEVEL_COLOURS = {"exact": BLUE, "cell_type": "#8fbbd9", "source": ORANGE, "split": RED}
CHAR = 5.6  # px per character of the 10 px font (for margins)
FONT = 'font-family="system-ui,sans-serif" font-size="10"'


class Svg:
    """Elements in a ``width`` x ``height`` pixel box."""

    def __init__(self, width: float, height: float) -> None:
        self.width, self.height = width, height
        self.parts: list[str] = []

    def rect(self, x: float, y: float, w: float, h: float, fill: str, title: str = "") -> None:
        tip = f"<title>{html.escape(title)}</title>" if title else ""
        self.parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" '
            f'fill="{fill}">{tip}</rect>'
        )

    def line(self, x1: float, y1: float, x2: float, y2: float, dash: bool = False) -> None:
        style = ' stroke-dasharray="4 3"' if dash else ""
        self.parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="#444" '
            f'stroke-width="0.8"{style}/>'
        )

    def text(self, x: float, y: float, s: str, anchor: str = "start", **kw: str) -> None:
        attrs = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in kw.items())
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{attrs}>{html.escape(s)}</text>'
        )

    def render(self) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" '
            f'height="{self.height:.0f}" viewBox="0 0 {self.width:.0f} {self.height:.0f}" {FONT}>'
            + "".join(self.parts)
            + "</svg>"
        )


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round numbers (1, 2, 5 x 10^k steps) from the first at or above ``lo`` to the first at or
    above ``hi`` (an axis drawn to the last one holds every value)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if m * step >= raw)
    first, last = math.ceil(lo / step - 1e-9), math.ceil(hi / step - 1e-9)
    return [i * step for i in range(first, last + 1)]


def num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:.3g}"


def _legend(svg: Svg, x: float, y: float, items: Sequence[tuple[str, str]]) -> None:
    for i, (label, colour) in enumerate(items):
        svg.rect(x, y + 13 * i - 8, 9, 9, colour)
        svg.text(x + 13, y + 13 * i, label)


def sorted_bars(
    labels: Sequence[str],
    parts: Mapping[str, Sequence[float]],
    xlabel: str,
    flagged: set[str] = frozenset(),  # type: ignore[assignment]
    flag_label: str = "",
) -> str:
    """Horizontal bars, largest total first, each stacked by its ``parts`` (cells per split);
    ``flagged`` labels drawn red, ``flag_label`` saying why."""
    stack = np.asarray([list(v) for v in parts.values()], dtype=float).reshape(len(parts), -1)
    total = stack.sum(0)
    order = np.argsort(-total, kind="stable")
    row, left, plot_w = 11.0, 12 + CHAR * max((len(s) for s in labels), default=1), 460.0
    svg = Svg(left + plot_w + 150, 30 + row * len(labels) + 34)
    top = float(total.max()) if total.size else 1.0
    xt = ticks(0, top)
    scale = plot_w / max(xt[-1], 1e-9)
    for r, i in enumerate(order):
        y, x = 22 + r * row, left
        name = labels[i]
        svg.text(left - 4, y + row - 3, name, "end", fill=RED if name in flagged else "#222")
        for k, part in enumerate(parts):
            w = stack[k, i] * scale
            svg.rect(
                x, y + 1, w, row - 2, PART_COLOURS[k % 4], f"{name} {part}: {num(stack[k, i])}"
            )
            x += w
    _axis_x(svg, left, 22 + row * len(labels), scale, xt, xlabel)
    _legend(svg, left + plot_w + 12, 30, [(p, PART_COLOURS[k % 4]) for k, p in enumerate(parts)])
    if flagged:
        svg.text(left + plot_w + 12, 30 + 13 * len(parts) + 6, "red names:", fill=RED)
        for j, chunk in enumerate(_wrap(flag_label, 24)):
            svg.text(left + plot_w + 12, 30 + 13 * (len(parts) + j + 1) + 6, chunk, fill=RED)
    return svg.render()


def _wrap(text: str, width: int) -> list[str]:
    lines, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}".strip()
    return [*lines, cur] if cur else lines


def _axis_x(svg: Svg, left: float, y: float, scale: float, xt: list[float], label: str) -> None:
    svg.line(left, y, left + xt[-1] * scale, y)
    for t in xt:
        svg.line(left + t * scale, y, left + t * scale, y + 4)
        svg.text(left + t * scale, y + 14, num(t), "middle")
    svg.text(left + xt[-1] * scale / 2, y + 28, label, "middle")


def stacked_levels(
    rows: Sequence[str], levels: Sequence[str], counts: Sequence[Sequence[int]], xlabel: str
) -> str:
    """One horizontal bar per row, split into the fractions of its counts per level."""
    left, plot_w, row = 12 + CHAR * max(len(r) for r in rows), 420.0, 26.0
    svg = Svg(left + plot_w + 20, 16 + row * len(rows) + 56)
    for r, (name, c) in enumerate(zip(rows, counts, strict=True)):
        y, x, total = 10 + r * row, left, max(sum(c), 1)
        svg.text(left - 4, y + row / 2 + 3, name, "end")
        for level, n in zip(levels, c, strict=True):
            w = plot_w * n / total
            svg.rect(x, y + 3, w, row - 6, LEVEL_COLOURS.get(level, GREY), f"{name} {level}: {n:,}")
            x += w
    base = 10 + row * len(rows)
    _axis_x(svg, left, base, plot_w, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], xlabel)
    for i, level in enumerate(levels):
        svg.rect(left + 90 * i, base + 38, 9, 9, LEVEL_COLOURS.get(level, GREY))
        svg.text(left + 90 * i + 13, base + 46, level)
    return svg.render()


def _axis_y(
    svg: Svg, left: float, top: float, h: float, ymax: float, label: str, log: bool
) -> None:
    """The y axis of a ``h`` px plot; ``log``: decades 1, 10, 100, ... (values as log10(1 + v))."""
    svg.line(left, top, left, top + h)
    marks = (
        [(math.log10(1 + 10**k), f"{10**k:,}") for k in range(int(math.log10(max(ymax, 1))) + 2)]
        if log
        else [(t, num(t)) for t in ticks(0, ymax)]
    )
    span = max(m[0] for m in marks) if marks else 1.0
    for v, text in marks:
        y = top + h - h * v / span
        svg.line(left - 4, y, left, y)
        svg.text(left - 6, y + 3, text, "end")
    svg.text(12, top + h / 2, label, "middle", transform=f"rotate(-90 12 {top + h / 2:.1f})")


def histogram(
    edges: np.ndarray,
    counts: np.ndarray,
    xlabel: str,
    ylabel: str,
    log: bool,
    line: float | None = None,
) -> str:
    """Bars over ``edges`` (len(counts) + 1); ``log``: a log y axis; ``line``: a dashed threshold."""
    edges, counts = np.asarray(edges, float), np.asarray(counts, float)
    left, top, w, h = 62.0, 8.0, 500.0, 160.0
    svg = Svg(left + w + 20, top + h + 40)
    vals = np.log10(1 + counts) if log else counts
    ymax = float(counts.max()) if counts.size else 1.0
    span = math.log10(1 + 10 ** (int(math.log10(max(ymax, 1))) + 1)) if log else ticks(0, ymax)[-1]
    lo, hi = float(edges[0]), float(edges[-1])
    xs = (edges - lo) * w / max(hi - lo, 1e-9) + left
    for i, v in enumerate(vals):
        bar = h * v / max(span, 1e-9)
        label = f"{num(edges[i])} .. {num(edges[i + 1])}: {int(counts[i]):,}"
        svg.rect(xs[i], top + h - bar, xs[i + 1] - xs[i], bar, BLUE, label)
    _axis_y(svg, left, top, h, ymax, ylabel, log)
    svg.line(left, top + h, left + w, top + h)
    for t in (t for t in ticks(lo, hi, 6) if t <= hi):
        x = left + (t - lo) * w / max(hi - lo, 1e-9)
        svg.line(x, top + h, x, top + h + 4)
        svg.text(x, top + h + 14, num(t), "middle")
    svg.text(left + w / 2, top + h + 30, xlabel, "middle")
    if line is not None and lo <= line <= hi:
        x = left + (line - lo) * w / max(hi - lo, 1e-9)
        svg.line(x, top, x, top + h, dash=True)
    return svg.render()


def bars(labels: Sequence[str], values: Sequence[float], ylabel: str, **kw: float) -> str:
    """Vertical bars in the given order (one per file, volume, split); labels slanted when many."""
    n = len(labels)
    slant = n > 6
    longest = CHAR * max((len(s) for s in labels), default=1) * 0.72  # a 45-degree label's run
    left, top = max(62.0, longest - 6) if slant else 62.0, 8.0
    w = float(kw.get("width", max(140.0, min(620.0, 22.0 * n))))
    h = float(kw.get("height", 150.0))
    below = 12 + longest if slant else 20
    svg = Svg(left + w + 20, top + h + below + 6)
    ymax = max((float(v) for v in values), default=1.0)
    span = ticks(0, ymax)[-1] if ymax > 0 else 1.0
    step = w / max(n, 1)
    for i, (name, v) in enumerate(zip(labels, values, strict=True)):
        bar = h * float(v) / span
        svg.rect(
            left + i * step + step * 0.12,
            top + h - bar,
            step * 0.76,
            bar,
            BLUE,
            f"{name}: {num(v)}",
        )
        x, y = left + (i + 0.5) * step, top + h + 12
        if slant:
            svg.text(x, y, name, "end", transform=f"rotate(-45 {x:.1f} {y:.1f})")
        else:
            svg.text(x, y, name, "middle")
    _axis_y(svg, left, top, h, ymax, ylabel, False)
    svg.line(left, top + h, left + w, top + h)
    return svg.render()


def png_grey(img: np.ndarray) -> bytes:
    """An 8-bit grey PNG of ``img`` scaled to 0..255 (zlib only: no imaging library)."""
    a = np.asarray(img, float)
    span = float(a.max() - a.min()) or 1.0
    px = ((a - a.min()) * 255 / span).astype(np.uint8)
    raw = b"".join(b"\x00" + r.tobytes() for r in px)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    head = struct.pack(">IIBBBBB", px.shape[1], px.shape[0], 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", head)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def images(panels: Sequence[tuple[str, np.ndarray]]) -> str:
    """Grey images side by side, each 240 px wide at its own aspect, with its title above."""
    size, gap = 240.0, 24.0
    heights = [size * img.shape[0] / img.shape[1] for _, img in panels]
    svg = Svg(len(panels) * (size + gap), max(heights, default=0) + 24)
    for i, ((title, img), hgt) in enumerate(zip(panels, heights, strict=True)):
        x = i * (size + gap)
        svg.text(x + size / 2, 12, title, "middle")
        data = base64.b64encode(png_grey(img)).decode()
        svg.parts.append(
            f'<image x="{x:.1f}" y="18" width="{size:.0f}" height="{hgt:.1f}" '
            f'preserveAspectRatio="none" style="image-rendering:pixelated" '
            f'href="data:image/png;base64,{data}"/>'
        )
    return svg.render()
