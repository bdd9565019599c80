"""The part of every report, whatever the kind: the summary table first (MultiQC's "General
Statistics"), the splits, skipped records by reason and the warnings. A kind without a section of
its own (a plug-in that registers none) gets this part only."""

from __future__ import annotations

import datetime as dt
from typing import Any

from loaders import format as fmt
from loaders.format.digests import algorithm
from pipeline.report import plots
from pipeline.report.model import Figure, ReportContext, Section, Table, figure, splits_in_order


def build_date(index: fmt.Index) -> str:
    """When index.json (the commit point) was written, from its file time: the index itself holds
    no date, so that the same manifest builds byte-identical datasets."""
    path = fmt.index_path(index.root)
    stamp = dt.datetime.fromtimestamp(path.stat().st_mtime, tz=dt.timezone.utc)
    return stamp.strftime("%Y-%m-%d %H:%M UTC")


def facts(ctx: ReportContext) -> dict[str, Any]:
    """The summary table's rows: the inspect summary's numbers plus what only the index holds
    (generation, version, digest algorithm)."""
    s, index = ctx.summary, ctx.index
    algos = sorted({algorithm(e.digest) for e in index.shards}) or ["-"]
    codec = s.get("codec") or {}
    return {
        "name": s["name"],
        "kind": s["kind"],
        "generation": index.generation,
        "index version": index.raw.get("version"),
        "built (index.json written)": build_date(index),
        "encoding": s["encoding"],
        "shards": len(index.shards),
        "bytes stored": s["bytes"],
        "bytes raw": s["raw_bytes"],
        "compression": f"{codec.get('name', 'none')}, ratio {s['compression_ratio']}",
        "digest algorithm": ", ".join(algos),
        "sources": s["sources"],
        "sample types": ", ".join(s["samples"]) or "-",
        "plug-ins": ", ".join(s.get("plugins") or []) or "-",
        "skipped records": sum(int(v) for v in (s.get("skipped") or {}).values()),
        "warnings": len(s.get("warnings") or []),
    }


def summary_section(ctx: ReportContext) -> Section:
    s = ctx.summary
    rows = facts(ctx)
    samples = list(s["samples"])
    splits = splits_in_order(s["splits"])
    split_rows = [
        [
            name,
            s["splits"][name]["shards"],
            s["splits"][name]["records"],
            *(s["splits"][name]["units"].get(u, 0) for u in samples),
            s["splits"][name]["bytes"],
        ]
        for name in splits
    ]
    figs = [
        Figure(
            "summary",
            "Summary",
            data=rows,
            table=Table(["", "value"], [[k, v] for k, v in rows.items()]),
        ),
        Figure(
            "splits",
            "Per split: records, units, bytes",
            data={n: s["splits"][n] for n in splits},
            table=Table(["split", "shards", "records", *samples, "bytes"], split_rows),
            svg=plots.bars(
                splits, [s["splits"][n]["records"] for n in splits], "records", width=200, height=110
            )
            if len(splits) > 1
            else None,
        ),
        figure("skipped", "Skipped records by reason", lambda: _skipped(s)),
        Figure(
            "warnings",
            "Warnings",
            data=list(s.get("warnings") or []),
            note="none" if not s.get("warnings") else "",
            table=Table(["warning"], [[w] for w in s["warnings"]]) if s.get("warnings") else None,
        ),
    ]
    if s["vocabulary_sizes"]:
        figs.append(
            Figure(
                "vocabularies",
                "Vocabularies (label names; all of them in the JSON)",
                data=s["vocabulary_sizes"],
                table=Table(
                    ["field", "names", "first names"],
                    [
                        [k, n, ", ".join(s["vocabularies"][k][:8])]
                        for k, n in s["vocabulary_sizes"].items()
                    ],
                ),
            )
        )
    return Section("Dataset", figs)


def _skipped(s: dict[str, Any]) -> Figure:
    skipped = dict(s.get("skipped") or {})
    return Figure(
        "skipped",
        "Skipped records by reason",
        data=skipped,
        note="none: every record the sources held was stored" if not skipped else "",
        table=Table(["reason", "records"], [[k, v] for k, v in skipped.items()])
        if skipped
        else None,
    )


def generic_details(ctx: ReportContext, registered: list[str]) -> Section:
    """What a kind with no section of its own shows: its ``inspect`` details as a table."""
    kind = ctx.summary["kind"]
    rows = [[k, v if isinstance(v, int | float | str) else str(v)] for k, v in ctx.details.items()]
    return Section(
        f"{kind}",
        [
            Figure(
                "details",
                "What `inspect` says of this kind",
                data=dict(ctx.details),
                table=Table(["", "value"], rows) if rows else None,
                note="" if rows else "the kind describes nothing more",
            )
        ],
        intro=f"The kind {kind!r} registers no report section (kinds with one: "
        f"{', '.join(registered) or 'none'}): this is the generic part only. A plug-in adds its "
        "own with pipeline.report.register_report_section (docs/EXTENDING.md).",
    )
