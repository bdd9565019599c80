"""The HTML page: one file, its style and its one small script inline, its plots inline SVG; it
loads nothing from anywhere (no CDN, no font, no image file), so it opens offline and can be
mailed."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from pipeline.report.model import Figure, Section, Table

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;background:#fff}
main{max-width:980px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 2px} h2{font-size:18px;border-bottom:2px solid #3b75af;margin-top:34px}
h3{font-size:15px;margin:22px 0 6px} .sub{color:#666;margin:0 0 12px}
table{border-collapse:collapse;margin:6px 0;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f2f5f9;cursor:pointer} td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.flag td{background:#fdeedd} .missing{color:#8a5300;background:#fff7e6;padding:6px 10px;border-left:3px solid #e1812c}
.note{color:#555;font-size:13px} .warn{color:#a33}
nav a{margin-right:14px} svg{max-width:100%;height:auto} details summary{cursor:pointer;color:#3b75af}
"""
# sorts a table by the clicked column (numbers as numbers); marks the page rendered for the test
SCRIPT = """
document.querySelectorAll("th").forEach(function (th) {
  th.addEventListener("click", function () {
    var table = th.closest("table"), body = table.tBodies[0], i = th.cellIndex;
    var asc = th.dataset.dir !== "asc"; th.dataset.dir = asc ? "asc" : "desc";
    var key = function (tr) { var t = tr.children[i].textContent.replace(/,/g, ""); var n = parseFloat(t);
      return isNaN(n) ? t : n; };
    Array.from(body.rows).sort(function (a, b) { var x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1); }).forEach(function (r) { body.appendChild(r); });
  });
});
document.body.setAttribute("data-rendered", document.querySelectorAll("svg").length + " plots");
"""


def _cell(v: Any, top: float = 0.0) -> str:
    if isinstance(v, bool):
        return f"<td>{'yes' if v else 'no'}</td>"
    if isinstance(v, int) and top > 0:
        alpha = 0.08 + 0.6 * v / top
        return f'<td class="n" style="background:rgba(59,117,175,{alpha:.2f})">{v:,}</td>'
    if isinstance(v, int):
        return f'<td class="n">{v:,}</td>'
    if isinstance(v, float):
        return f'<td class="n">{v:,.4g}</td>'
    return f"<td>{html.escape('-' if v is None else str(v))}</td>"


def table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    flagged = set(t.flagged)
    nums = [v for row in t.rows for v in row if isinstance(v, int) and not isinstance(v, bool)]
    top = float(max(nums, default=0)) if t.shade else 0.0
    body = "".join(
        ("<tr class='flag'>" if i in flagged else "<tr>")
        + "".join(_cell(v, top) for v in row)
        + "</tr>"
        for i, row in enumerate(t.rows)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure_html(f: Figure) -> str:
    out = [f'<h3 id="{_anchor(f.key)}">{html.escape(f.title)}</h3>']
    if f.missing:
        return out[0] + f'<p class="missing">Not shown: {html.escape(f.missing)}</p>'
    if f.note:
        out.append(f'<p class="note">{html.escape(f.note)}</p>')
    if f.svg:
        out.append(f'<div class="plot">{f.svg}</div>')
    if f.table is not None:
        t = table_html(f.table)
        out.append(
            t
            if f.open_table
            else f"<details><summary>the table ({len(f.table.rows)} rows)</summary>{t}</details>"
        )
    return "\n".join(out)


def _anchor(key: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def render(
    title: str, subtitle: str, sections: Sequence[Section], missing: Sequence[str], notice: str = ""
) -> str:
    """The whole page: title, the older-index notice and the figures the dataset cannot show (if
    any), then each section."""
    nav = " ".join(f'<a href="#{_anchor(s.title)}">{html.escape(s.title)}</a>' for s in sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>",
        "<body><main>",
        f"<h1>{html.escape(title)}</h1><p class='sub'>{html.escape(subtitle)}</p>",
        f"<nav>{nav}</nav>",
    ]
    if notice:
        parts.append(f'<p class="missing">{html.escape(notice)}</p>')
    if missing:
        items = "".join(f"<li>{html.escape(m)}</li>" for m in missing)
        parts.append(
            f'<div class="missing"><b>Figures this dataset cannot show ({len(missing)}):</b>'
            f"<ul>{items}</ul></div>"
        )
    for s in sections:
        parts.append(f'<h2 id="{_anchor(s.title)}">{html.escape(s.title)}</h2>')
        if s.intro:
            parts.append(f'<p class="note">{html.escape(s.intro)}</p>')
        parts += [figure_html(f) for f in s.figures]
    parts.append(f"</main><script>{SCRIPT}</script></body></html>")
    return "\n".join(parts) + "\n"
