"""A report assembled and written: the page (FILE.html), every figure's data (FILE.json, whose
``inspect`` part is exactly what ``shardsmith inspect --json`` prints) and a MultiQC custom-content
table (FILE_mqc.json), each written atomically."""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaders import format as fmt
from loaders.format.files import atomic_write_bytes
from pipeline.errors import OutputError
from pipeline.model import open_index
from pipeline.report import REPORT_SECTIONS
from pipeline.report.generic import generic_details, summary_section
from pipeline.report.model import ReportContext, Section, SectionFn, splits_in_order
from pipeline.report.page import render
from pipeline.verify import summary

REPORT_FORMAT = 1  # the layout of FILE.json


@dataclass
class Report:
    name: str
    shown: str  # the dataset as the user named it (a folder or a URL)
    summary: dict[str, Any]
    sections: list[Section]
    index_version: int

    @property
    def notice(self) -> str:
        """What an index written by an older shardsmith means for this report ('' if current)."""
        if self.index_version >= fmt.INDEX_VERSION:
            return ""
        return (
            f"Built by an older shardsmith: index version {self.index_version} (this one writes "
            f"{fmt.INDEX_VERSION}). "
            + (
                f"{len(self.missing)} figure(s) cannot be shown from it (listed below); rebuild "
                "the dataset with this shardsmith to see them."
                if self.missing
                else "Every figure of this report could still be drawn from it."
            )
        )

    @property
    def missing(self) -> list[str]:
        """'Section: figure: why' of each figure the dataset cannot show."""
        return [
            f"{s.title}, {f.title}: {f.missing}"
            for s in self.sections
            for f in s.figures
            if f.missing
        ]


def kind_section(ctx: ReportContext) -> Section:
    """The dataset kind's own section (its registry entry), or the generic details."""
    kind = ctx.summary["kind"]
    if kind not in REPORT_SECTIONS.names():
        return generic_details(ctx, REPORT_SECTIONS.names())
    module, func = REPORT_SECTIONS.get(kind).split(":")
    fn: SectionFn = getattr(importlib.import_module(module), func)
    return fn(ctx)


def build_report(root: Path, shown: str) -> Report:
    s = summary(root)
    index = open_index(root)
    ctx = ReportContext(index, s)
    version = int(index.raw.get("version") or 1)
    return Report(s["name"], shown, s, [summary_section(ctx), kind_section(ctx)], version)


def to_json(report: Report) -> dict[str, Any]:
    return {
        "report_format": REPORT_FORMAT,
        "dataset": report.shown,
        "inspect": report.summary,  # == `shardsmith inspect --json DATASET`
        "sections": {
            s.title: {
                f.key: (
                    {"missing": f.missing}
                    if f.missing
                    else {
                        "title": f.title,
                        "data": f.data,
                        **({"table": f.table.to_json()} if f.table is not None else {}),
                    }
                )
                for f in s.figures
            }
            for s in report.sections
        },
        "index_version": report.index_version,
        "notice": report.notice,
        "not_shown": report.missing,
    }


def to_multiqc(report: Report) -> dict[str, Any]:
    """MultiQC custom content (docs.seqera.io/multiqc, "Custom Content"): one table, a row per
    split, so a lab pipeline's MultiQC run shows the dataset beside its other tools."""
    s = report.summary
    samples = list(s["samples"])
    data = {
        f"{s['name']} {split}": {
            "shards": v["shards"],
            "records": v["records"],
            **{u: v["units"].get(u, 0) for u in samples},
            "MB": round(v["bytes"] / 1e6, 3),
        }
        for split, v in ((n, s["splits"][n]) for n in splits_in_order(s["splits"]))
    }
    return {
        "id": f"shardsmith_{s['name']}".replace("-", "_"),
        "section_name": f"shardsmith dataset {s['name']}",
        "description": f"{s['kind']} dataset {report.shown}: records and units per split "
        f"({len(s.get('warnings') or [])} warning(s); the full report: shardsmith report)",
        "plot_type": "table",
        "pconfig": {"id": f"shardsmith_{s['name']}_table".replace("-", "_"), "title": s["name"]},
        "data": data,
    }


def outputs(html_path: Path) -> tuple[Path, Path, Path]:
    """(FILE.html, FILE.json, FILE_mqc.json)."""
    return (
        html_path,
        html_path.with_suffix(".json"),
        html_path.with_name(f"{html_path.stem}_mqc.json"),
    )


def check_writable(html_path: Path) -> None:
    """Before any work: a file can be created in ``html_path``'s folder (made if missing); else an
    OutputError (exit 2) naming the path."""
    try:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            prefix=f".{html_path.name}.", suffix=".probe", dir=html_path.parent
        )
        os.close(fd)
        os.unlink(tmp)
        if html_path.is_dir():
            raise IsADirectoryError(21, "is a folder")
    except OSError as e:
        raise OutputError(
            f"{html_path}: cannot write the report there ({e.strerror or e}): pass -o a file "
            "path in a folder you can write"
        ) from None


def write_report(report: Report, html_path: Path) -> list[Path]:
    """The JSON and MultiQC files, then the page (each atomic); returns the paths written."""
    page, data, mqc = outputs(html_path)
    subtitle = f"shardsmith report of {report.shown}: a {report.summary['kind']} dataset"
    atomic_write_bytes(data, json.dumps(to_json(report), indent=1, default=str).encode())
    atomic_write_bytes(mqc, json.dumps(to_multiqc(report), indent=1).encode())
    text = render(report.name, subtitle, report.sections, report.missing, report.notice)
    atomic_write_bytes(page, text.encode())
    return [page, data, mqc]
