"""Report sections come from a registry: a plug-in kind without one gets the generic part (its
`inspect` details, the summary, skipped records), and one it registers is what the page shows.
The kind is tests/plugin_toy.py's, built with its `.toy` sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.report import REPORT_SECTIONS, register_report_section
from pipeline.report.model import Figure, ReportContext, Section, Table
from tests.plugin_toy import write_toy

MANIFEST = """
[dataset]
name = "toy"
kind = "toyvec"
shard_size_mb = 0.0003
plugins = ["tests.plugin_toy"]

[[sources]]
path = "src/*.toy"
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipeline.build import build  # import weight: the pipeline, only here

    root = tmp_path_factory.mktemp("toy")
    (root / "src").mkdir()
    recs = [
        {"group": f"g{i % 3}", "vec": [i, 0.5, 1.0, 2.0], "tokens": [i % 7], "skip": i == 4}
        for i in range(12)
    ]
    write_toy(root / "src" / "a.toy", recs)
    (root / "m.toml").write_text(MANIFEST)
    build(root / "m.toml", root / "out", jobs=1, progress=False)
    return root / "out"


def toy_section(ctx: ReportContext) -> Section:
    """A plug-in's own section: one table of its records per split."""
    rows = [[s, v["records"]] for s, v in ctx.summary["splits"].items()]
    return Section(
        "Toy vectors",
        [
            Figure(
                "toy_records",
                "Toy records",
                data=dict(rows),
                table=Table(["split", "records"], rows),
            )
        ],
    )


def run(toy: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict]:
    assert main(["report", str(toy), "-o", str(out)]) == 0
    capsys.readouterr()
    return out.read_text(), json.loads(out.with_suffix(".json").read_text())


def test_a_kind_without_a_section_gets_the_generic_part(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "toyvec" not in REPORT_SECTIONS
    page, doc = run(toy, tmp_path / "r.html", capsys)
    assert "registers no report section" in page
    assert doc["sections"]["toyvec"]["details"]["data"] == doc["inspect"]["details"]
    skipped = doc["sections"]["Dataset"]["skipped"]["data"]
    assert skipped == doc["inspect"]["skipped"] and sum(skipped.values()) == 1


def test_a_section_a_plugin_registers_is_the_one_shown(
    toy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_report_section("toyvec", f"{__name__}:toy_section")
    try:
        page, doc = run(toy, tmp_path / "r.html", capsys)
    finally:
        del REPORT_SECTIONS["toyvec"]
    assert "registers no report section" not in page and "<h2" in page and "Toy vectors" in page
    records = {s: v["records"] for s, v in doc["inspect"]["splits"].items()}
    assert doc["sections"]["Toy vectors"]["toy_records"]["data"] == records
