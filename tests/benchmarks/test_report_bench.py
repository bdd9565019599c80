"""The report's benchmark (benchmarks/report_bench.py): it measures a real report of a built
dataset, and target 47 compares it with the build's own time (met at <= 5%, missed above)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.report_bench import measure, report_targets

pytestmark = pytest.mark.bench  # the benchmark harness (benchmarks/)


def test_measure_writes_the_report_and_times_it(demo_builds: dict[str, Path]) -> None:
    got = measure(demo_builds["demo_ct"], rounds=2)
    assert len(got["rounds"]) == 2 and got["report_s"] > 0 and got["cli_wall_s"] > 0
    assert got["page_bytes"] > 10_000 and got["json_bytes"] > 1_000 and got["mqc_bytes"] > 100


def test_target_47_is_the_report_over_the_build_time() -> None:
    met = report_targets({"report_s": 0.04, "build_internal_s": 1.0, "build_label": "main"})[0]
    missed = report_targets({"report_s": 0.2, "build_internal_s": 1.0})[0]
    assert met["name"] == "47" and met["value"] == pytest.approx(0.04) and met["status"] == "met"
    assert missed["status"] == "missed" and "0.200 s" in missed["detail"]
    unmeasured = report_targets({"skipped": "--skip report"})[0]
    assert unmeasured["status"] == "not measured" and unmeasured["detail"] == "--skip report"
