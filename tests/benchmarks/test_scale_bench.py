"""`make bench-scale`'s rounds: each build between two limits (L B L B L), the median ratio
reported."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.bench  # the benchmark harness (benchmarks/)


def test_each_build_is_bracketed_by_two_limits_and_the_median_round_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import scale_bench
    from benchmarks.pipeline_bench import BuildRun

    calls: list[str] = []
    # round limits (4+4)/2, (4+2)/2, (2+4)/2 over builds 20, 10, 15: ratios 0.2, 0.3, 0.2
    limits, builds = iter([4.0, 4.0, 2.0, 4.0]), iter([20.0, 10.0, 15.0])

    def limit(files: Any, codec: str, repeats: int = 3) -> dict[str, float]:
        calls.append("limit")
        cpu = next(limits)
        return {
            "cpu_seconds": cpu,
            "seconds": cpu,
            "read_seconds": 0.0,
            "cells": 100,
            "cells_per_s": 100.0 / cpu,
        }

    def build(label: str, manifest: Path, out: Path, jobs: int, **kw: Any) -> BuildRun:
        calls.append(f"build {out.name}")
        cpu = next(builds)
        return BuildRun(label, 100, jobs, "blosc-lz4", 1, cpu / 2, -1, 50.0 + cpu, 0, cpu_s=cpu)

    floors = iter([3.0, 1.0])  # the floor's two measurements: before the rounds, after them

    def floor(files: Any, codec: str) -> dict[str, float]:
        calls.append("floor")
        return {"cpu_seconds": next(floors)}

    data = SimpleNamespace(files=[tmp_path / "a.h5ad"], csr_bytes=1, file_bytes=1)
    monkeypatch.setattr(scale_bench, "ensure_dataset", lambda *a, **k: data)
    monkeypatch.setattr(scale_bench, "write_manifest", lambda path, *a, **k: path)
    monkeypatch.setattr(scale_bench.pb, "codec_bound_limit", limit)
    monkeypatch.setattr(scale_bench.pb, "run_build", build)
    monkeypatch.setattr(scale_bench.pb, "codec_floor", floor)
    monkeypatch.setattr(scale_bench, "warm_page_cache", lambda files: calls.append("warm"))
    res = scale_bench.measure(100, tmp_path, tmp_path, 2, 1, "zarr", rounds=3)
    assert calls == [
        "warm",
        "floor",
        "limit",
        "build shards-100-zarr-r0",
        "limit",
        "build shards-100-zarr-r1",
        "limit",
        "build shards-100-zarr-r2",
        "limit",
        "floor",
    ]
    # the floor: the mean of its two measurements (2.0) against each build (20, 10, 15), median
    assert res["floor_cpu_s"] == pytest.approx(2.0) and res["floor_cpu_s_before_after"] == [3, 1]
    assert res["vs_floor_cpu"] == pytest.approx(2.0 / 15.0)
    assert [round(r["vs_limit_cpu"], 3) for r in res["rounds"]] == [0.2, 0.3, 0.2]
    assert res["vs_limit_cpu"] == pytest.approx(0.2)  # the median round, not the best
    assert res["build"]["cpu_s"] in (20.0, 15.0) and res["limit_cpu_s"] in (4.0, 3.0)
    assert [r["limit_cpu_s_before_after"] for r in res["rounds"]] == [[4, 4], [4, 2], [2, 4]]
    text = scale_bench.markdown(
        {
            "sizes": [res],
            "command": "c",
            "date": "d",
            "load_avg": [0.0],
            "machine": {},
            "jobs": 2,
        }
    )
    assert "0.200, 0.300, 0.200" in text
    assert "x floor (CPU) 100: 0.133 (floor 2.00 CPU-s)" in text


def test_the_floor_reads_and_compresses_what_the_limit_does(tmp_path: Path) -> None:
    """codec_floor does codec_bound_limit's work (every block of the CSR arrays) with reused
    memory: the same raw bytes, block by block, including a last partial block."""
    import h5py
    import numpy as np

    from benchmarks.pipeline_bench import codec_bound_limit, codec_floor

    rng = np.random.default_rng(0)
    files = []
    for i, n in enumerate((1000, 3001)):
        path = tmp_path / f"part_{i}.h5ad"
        with h5py.File(path, "w") as f:
            x = f.create_group("X")
            x.attrs["shape"] = (n // 10, 50)
            x["indptr"] = np.arange(0, n + 1, 10, dtype=np.int64)[: n // 10 + 1]
            x["indices"] = rng.integers(0, 50, n, dtype=np.int32)
            x["data"] = rng.integers(1, 9, n).astype(np.float32)
        files.append(path)
    limit = codec_bound_limit(files, "blosc-lz4", block_bytes=4096, repeats=1)
    floor = codec_floor(files, "blosc-lz4", block_bytes=4096)
    assert floor["raw_bytes"] == limit["raw_bytes"] > 4096 * 3
    # the same blocks compressed to the same sizes: the same bytes were read and encoded
    assert floor["compressed_bytes"] == limit["compressed_bytes"]
    assert floor["cpu_seconds"] > 0
