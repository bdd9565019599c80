"""benchmarks/ct_bench.py runs end to end at tiny sizes and reports every figure (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import ct_bench


def test_ct_bench_smoke(tmp_path: Path) -> None:
    cfg = ct_bench.CtBenchConfig(loader_shape=(48, 40, 16), loader_volumes=3, seconds=0.05, repeats=1,
                                 build_shape=(32, 32, 24), build_volumes=2, max_points=2000)
    r = ct_bench.run_ct_bench(tmp_path / "data", tmp_path / "work", cfg)
    assert set(r["loader"]) == {"shardsmith", "per-item", "npz cache", "per-item (no mask)"}
    for name, m in r["loader"].items():
        assert m["volumes_per_s"] > 0 and m["points_per_s"] > 0, name
    assert r["bytes"]["npy"] > r["bytes"]["shards"] > 0 and r["bytes"]["npz_cache"] > 0
    assert r["build_512"]["volumes_per_s"] > 0 and r["build_512"]["peak_rss_mib"] > 0
    assert r["volume_memory"]["traced_peak_x"] > 0
    assert "| shardsmith |" in r["table"] and "| per-item |" in r["table"]


def test_a_failing_build_fails_the_bench(tmp_path: Path) -> None:
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "broken.npy").write_bytes(b"not a volume")
    m = ct_bench.write_manifest(tmp_path / "m.toml", str(tmp_path / "v" / "*.npy"), "x", "zarr", 1000, 0)
    with pytest.raises(RuntimeError, match="broken.npy"):
        ct_bench.build(m, tmp_path / "out", 1)
