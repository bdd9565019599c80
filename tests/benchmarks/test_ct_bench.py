"""benchmarks/ct_bench.py (with ct_data.py and ct_measure.py) runs end to end at tiny sizes and
reports every figure (no timing asserted)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import ct_bench, ct_data, ct_measure

pytestmark = pytest.mark.bench  # the benchmark harness (benchmarks/)


def test_ct_bench_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = ct_bench.CtBenchConfig(
        loader_shape=(48, 40, 16),
        loader_volumes=3,
        seconds=0.05,
        repeats=1,
        build_shape=(32, 32, 24),
        build_volumes=2,
        max_points=2000,
        crop_slices=40,
        crop_volumes=2,
    )
    monkeypatch.chdir(tmp_path)  # relative folders, as the CLI's defaults are
    r = ct_bench.run_ct_bench(Path("data"), Path("work"), cfg)
    assert set(r["loader"]) == {"shardsmith", "per-item", "npz cache", "per-item (no mask)"}
    for name, m in r["loader"].items():
        assert m["volumes_per_s"] > 0 and m["points_per_s"] > 0, name
    assert r["bytes"]["npy"] > r["bytes"]["shards"] > 0 and r["bytes"]["npz_cache"] > 0
    assert r["build_512"]["volumes_per_s"] > 0 and r["build_512"]["peak_rss_mib"] > 0
    assert r["volume_memory"]["traced_peak_x"] > 0
    assert "| shardsmith |" in r["table"] and "| per-item |" in r["table"]
    assert (
        r["parity"]["volumes"] == 3 and r["parity"]["compared_exactly"] >= 1
    )  # some volume under the cap
    c = r["crop"]  # crop figure: both loaders ran, the crop timed (and checked) before and after
    assert c["ratio"] > 0 and set(c["loader"]) == {"no augmentation", "crop + flip"}
    assert c["crop"]["ms"]["before"] > 0 and c["crop"]["ms"]["after"] > 0
    assert 0 < c["crop"]["kept"] < c["crop"]["points"]
    assert "crop + flip / no augmentation" in r["table"]


def test_parity_fails_when_the_methods_disagree(tmp_path: Path) -> None:
    vols = ct_data.corpus(tmp_path / "data", (48, 40, 16), 2)
    m = ct_data.write_manifest(
        tmp_path / "m.toml", str(vols[0].parent / "*.npy"), "x", "zarr", 100_000, 0
    )
    ct_measure.build(m, tmp_path / "out", 1)
    cache = ct_data.write_npz_cache(vols, tmp_path / "npz", 100_000)
    assert ct_data.check_parity(cache, tmp_path / "out") == {"volumes": 2, "compared_exactly": 2}
    z = ct_data.npz_item(cache[1], with_kept=True)
    z["hu"] = z["hu"].copy()
    z["hu"][0] += 1  # one feature value off
    np.savez_compressed(cache[1], **z)
    with pytest.raises(
        RuntimeError, match="chest_001.npy: shards and per-item give different points"
    ):
        ct_data.check_parity(cache, tmp_path / "out")
    np.savez_compressed(cache[1], **{**z, "kept": z["kept"] + 1})
    with pytest.raises(RuntimeError, match="chest_001.npy: per-item keeps"):
        ct_data.check_parity(cache, tmp_path / "out")


def test_a_failing_build_fails_the_bench(tmp_path: Path) -> None:
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "broken.npy").write_bytes(b"not a volume")
    m = ct_data.write_manifest(
        tmp_path / "m.toml", str(tmp_path / "v" / "*.npy"), "x", "zarr", 1000, 0
    )
    with pytest.raises(RuntimeError, match="broken.npy"):
        ct_measure.build(m, tmp_path / "out", 1)
