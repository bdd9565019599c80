"""Smoke test of the benchmark harness at tiny sizes: the output is well-formed. No timed
assertions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("psutil")

from benchmarks import run  # noqa: E402
from benchmarks.synth import SynthParams, ensure_dataset, random_csr  # noqa: E402

pytestmark = pytest.mark.bench  # the benchmark harness (benchmarks/)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_random_csr_is_valid_and_sparse() -> None:
    x = random_csr(500, 300, 0.1, np.random.default_rng(0))
    assert x.shape == (500, 300) and x.dtype == np.float32
    assert x.has_sorted_indices and x.nnz > 0
    assert (x.data >= 1).all()
    assert 0.07 < x.nnz / (500 * 300) < 0.13
    assert (
        np.diff(x.indices.reshape(-1)[: x.indptr[1]]).min(initial=1) > 0
    )  # distinct columns per row


def test_dataset_cache_is_reused(tmp_path: Path) -> None:
    p = SynthParams(n_cells=400, n_genes=50, n_perturbations=5, n_files=2)
    a = ensure_dataset(p, tmp_path, log=False)
    b = ensure_dataset(p, tmp_path, log=False)
    assert len(a.files) == 2 and all(f.exists() for f in a.files)
    assert a.generate_s > 0 and b.generate_s == 0.0 and a.nnz == b.nnz


def _positive(x: object) -> bool:
    return isinstance(x, (int, float)) and x > 0


def test_harness_tiny_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    py311 = (
        tmp_path / "python3.11"
    )  # annbatch's interpreter, too old: its skip reason, nothing installed
    py311.write_text("#!/bin/sh\necho 3 11 9\n")
    py311.chmod(0o755)
    monkeypatch.setenv("SHARDSMITH_ANNBATCH_PYTHON", str(py311))
    rc = run.main(
        [
            "--quick",
            "--out",
            str(out),
            "--data-dir",
            str(data),
            "--cells",
            "3000",
            "--genes",
            "100",
            "--perturbations",
            "10",
            "--sizes",
            "1500,3000",
            "--incr-cells",
            "2400",
            "--sentence-size",
            "8",
            "--shard-size-mb",
            "0.2",
            "--seconds",
            "0.05",
            "--repeats",
            "1",
            "--build-jobs",
            "1",
            "--jobs-compare",
            "1",
            "--skip",
            "scdataset",
        ]
    )
    assert rc == 0
    res = json.loads((out / "docs" / "benchmarks" / "results.json").read_text())
    for key in (
        "date",
        "config",
        "machine",
        "packages",
        "datasets",
        "loader",
        "pipeline",
        "gpu",
        "targets",
        "total_s",
        "plots",
        "page_cache",
    ):
        assert key in res, key
    m = res["machine"]
    assert _positive(m["cpu_count_logical"]) and _positive(m["ram_gib"]) and m["platform"]
    assert res["packages"]["numpy"] != "not installed"
    main = res["datasets"]["main"]
    assert main["n_cells"] == 3000 and main["n_genes"] == 100 and _positive(main["nnz"])
    assert res["config"]["mode"].startswith("quick")

    # Baselines may fail on a machine without them (reported as a note); our own loader and builds
    # must work: a loader or a build that raises fails this test.
    loader = res["loader"]["results"]
    methods = {r["method"] for r in loader}
    assert {"scipy in-memory gather+densify", "h5py CSR row gather", "anndata backed"} <= methods
    for r in loader:
        assert _positive(r["peak_rss_mb"]) and r["ttfb_s"] >= 0, r["method"]
        assert r["note"].startswith("FAILED") or (
            _positive(r["cells_per_s"]) and _positive(r["mb_per_s"])
        ), r
    ours = [r for r in loader if r["method"].startswith("shards")]
    assert {r["params"]["sample"] for r in ours} == {"cells", "pairs", "sentences"}
    for r in ours:
        assert not r["note"].startswith("FAILED") and _positive(r["cells_per_s"]), r

    pipe = res["pipeline"]
    assert not pipe.get("skipped"), pipe
    for codec in ("blosc-lz4", "blosc-zstd"):
        assert _positive(pipe["codec_limit"][codec]["cells_per_s"])
    assert [b["n_cells"] for b in pipe["sweep"]] == [1500, 3000]
    inc = pipe["incremental"]
    builds = [
        *pipe["sweep"],
        *pipe["jobs"],
        pipe["zstd"],
        inc["full"],
        inc.get("changed"),
        inc.get("nochange"),
    ]
    for b in filter(None, builds):
        assert _positive(b["wall_s"]) and _positive(b["peak_rss_mb"])
        assert b["rc"] == 0 and _positive(b["cells_per_s"]) and not b.get("error"), b
    assert {b["jobs"] for b in pipe["jobs"]} == {1}
    assert inc["files"] == 8 and _positive(inc["nochange"]["wall_s"])
    assert (
        inc["dry_run"]["rc"] == 0 and inc["dry_run"]["unchanged"]
    )  # the dry run was timed and wrote nothing
    backends = pipe["backends"]
    assert backends["byte_identical"] is True, backends
    assert all(r.get("rc") == 0 for r in backends["runs"].values() if "skipped" not in r), backends

    # the 11, benchmarks/targets_extra.py's 12, report_bench's 1, remote_link_bench's 4 (46a-d)
    assert len(res["targets"]) == 28
    assert res["loader"]["interleaved"]["results"], "the same-process interleaved run is missing"
    for t in res["targets"]:
        assert t["status"] in ("smoke", "not measured", "reported"), (
            t
        )  # quick sizes: figures, no met/missed verdict
        assert "missed" not in t.get("by", "")
        assert t["value"] is None or t["value"] > 0, t
    assert res["gpu"]["status"]

    for key in (
        "spike",
        "ct",
    ):  # the modality figures ran (tiny in quick mode) and produced their table
        assert "table" in res[key] and not res[key].get("error"), res[key]
    assert (
        res["spike"]["loader"]["shardsmith"]["samples_per_s"] > 0
        and res["spike"]["bytes"]["shards"] > 0
    )
    assert res["ct"]["loader"]["shardsmith"]["volumes_per_s"] > 0

    assert res["annbatch"]["status"] == "skipped" and "3.11.9" in res["annbatch"]["reason"], res[
        "annbatch"
    ]
    md = (out / "BENCHMARKS.md").read_text()
    assert f"annbatch: skipped — {res['annbatch']['reason']}" in md
    assert "smoke run" in md.lower() and "**missed" not in md.split("## Loader")[0]
    for heading in (
        "## Machine",
        "## Data",
        "## Targets",
        "## Loader",
        "## Pipeline",
        "## GPU",
        "## Spike",
        "## CT",
    ):
        assert heading in md
    assert res["plots"], "no plot written"
    for rel in res["plots"].values():
        png = out / rel
        assert png.read_bytes()[:8] == PNG_MAGIC
        assert f"]({rel})" in md
