"""benchmarks/ct_formats_bench.py runs at a tiny size, reports every format, and fails when a
format's build stores other points than the .npy build (a timing of different work would mean
nothing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import ct_formats_bench as fb

pytestmark = pytest.mark.bench  # the benchmark harness (benchmarks/)

pytest.importorskip("nibabel")
pytest.importorskip("nrrd")
pytest.importorskip("pydicom")


def test_formats_bench_smoke_and_parity(tmp_path: Path) -> None:
    r = fb.run_formats_bench(
        tmp_path / "data",
        tmp_path / "work",
        shape=(40, 36, 16),
        volumes=2,
        repeats=1,
        max_points=2000,
    )
    assert set(r["formats"]) == set(fb.FORMATS)
    for name, row in r["formats"].items():
        assert row["seconds_per_volume"] > 0 and row["mb_on_disk"] > 0, name
        assert row["peak_rss_mib"] > 0, name
    assert r["formats"]["npy"]["vs_npy"] == 1.0
    assert "| dicom |" in r["table"] and "| nifti (.nii.gz) |" in r["table"]
    corpus = tmp_path / "data" / "ct_formats_40x36x16_2"
    vol = np.load(corpus / "npy" / "chest_001.npy")
    from pipeline.modalities.ct.writers import chest_affine, write_nrrd

    write_nrrd(corpus / "nrrd" / "chest_001.nrrd", vol[::-1], chest_affine(fb.SPACING, fb.ORIGIN))
    with pytest.raises(RuntimeError, match=r"nrrd \(gzip\) stores other points than the \.npy"):
        fb.run_formats_bench(
            tmp_path / "data",
            tmp_path / "work",
            shape=(40, 36, 16),
            volumes=2,
            repeats=1,
            max_points=2000,
        )
