"""What a CT build from .npy volumes refuses and what it accepts: a bad volume (pickled objects,
2-D, truncated, NaN) is a clear error naming the file, through the API and the CLI, and nothing is
written; a manifest error names its key; the split keeps a patient's folder together; the shipped
manifests build and verify. Building and loading end to end: tests/modalities/ct/test_ct_pipeline.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.errors import ManifestError, SourceError
from pipeline.manifest import load_manifest
from pipeline.modalities.ct.demo import write_ct_demo
from pipeline.model import get_kind
from pipeline.verify import summary, verify

REPO = Path(__file__).resolve().parents[3]
TIMEOUT = 120


BAD = {
    "object": (
        lambda p: np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True),
        "Python objects",
    ),
    "flat": (lambda p: np.save(p, np.zeros((8, 8), np.int16)), "expected a 3-D volume"),
    "cut": (lambda p: p.write_bytes(_npy_bytes()[:-7]), "truncated .npy"),
    "nan": (lambda p: np.save(p, _nan_volume()), "non-finite value"),
}


def _npy_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, np.zeros((8, 8, 8), np.int16))
    return buf.getvalue()


def _nan_volume() -> np.ndarray:
    v = np.full((16, 16, 8), 40.0, np.float32)
    v[3, 4, 5] = np.nan
    return v


@pytest.mark.process
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_volumes_are_clear_errors_naming_the_file(
    tmp_path: Path, case: str, ct_npy: Any
) -> None:
    write, msg = BAD[case]
    (tmp_path / "vols").mkdir()
    np.save(tmp_path / "vols" / "good.npy", np.full((16, 16, 8), 40, np.int16))
    write(tmp_path / "vols" / f"bad_{case}.npy")
    (tmp_path / "m.toml").write_text(ct_npy.manifest(extra="min_points = 0"))
    with pytest.raises(SourceError, match=rf"bad_{case}\.npy: .*{msg}"):
        build(tmp_path / "m.toml", tmp_path / "out", jobs=2, progress=False)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            str(tmp_path / "m.toml"),
            "--out",
            str(tmp_path / "out2"),
            "--no-progress",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert r.returncode == 2 and f"bad_{case}.npy" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "index.json").exists()


def test_manifest_errors_name_the_key(tmp_path: Path, ct_npy: Any) -> None:
    (tmp_path / "vols").mkdir()
    np.save(tmp_path / "vols" / "v.npy", np.zeros((4, 4, 4), np.int16))
    for extra, split, key in (
        ('window = "liver"', ct_npy.NO_HOLDOUT, "ct.window"),
        ("band = [1, 2, 3]", ct_npy.NO_HOLDOUT, "ct.band"),
        ("colour = 1", ct_npy.NO_HOLDOUT, "ct.colour"),
        ("", 'group = "patient"', "split.group"),
        ("", "val_fraction = 0.8\ntest_fraction = 0.5", "split.test_fraction"),
        ("", "val_fraction = -0.1", "split.val_fraction"),
    ):
        (tmp_path / "m.toml").write_text(ct_npy.manifest(extra=extra, split=split))
        with pytest.raises(ManifestError, match=r"\[" + re.escape(key) + r"\]"):
            load_manifest(tmp_path / "m.toml")


@pytest.mark.process
def test_shipped_manifests_build(tmp_path: Path) -> None:
    """data_manifests/demo_ct.toml over `write_ct_demo` (as `make shards` runs it), and the folder
    example with its path pointed at a patient-folder layout: every key in them is valid and they
    build and verify."""
    (tmp_path / "data_manifests").mkdir()
    shutil.copy(
        REPO / "data_manifests" / "demo_ct.toml", tmp_path / "data_manifests" / "demo_ct.toml"
    )
    write_ct_demo(tmp_path / "data" / "demo")
    for f in ("zarr", "tar"):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "build",
                str(tmp_path / "data_manifests" / "demo_ct.toml"),
                "--out",
                str(tmp_path / f"demo-{f}"),
                "--format",
                f,
                "--no-progress",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert r.returncode == 0, r.stderr
        assert verify(tmp_path / f"demo-{f}") == []
        details = summary(tmp_path / f"demo-{f}")["details"]  # 4 .npy, one NIfTI, NRRD, DICOM
        assert details["volumes"] == 7
        assert details["formats"] == {"npy": 4, "nifti": 1, "nrrd": 1, "dicom": 1}
    example = (REPO / "data_manifests" / "examples" / "ct_folder.toml").read_text()
    assert 'path = "/data/chest_ct/*/*.npy"' in example
    for i, p in enumerate(sorted((tmp_path / "data" / "demo" / "ct").glob("*.npy"))):
        (tmp_path / "chest" / f"patient_{i // 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(p, tmp_path / "chest" / f"patient_{i // 2}" / p.name)
    (tmp_path / "ex.toml").write_text(example.replace("/data/chest_ct", str(tmp_path / "chest")))
    m = load_manifest(tmp_path / "ex.toml")
    assert (
        len(m.sources) == 4 and m.config.group == "folder" and m.config.settings.resolution == 256
    )
    out = build(tmp_path / "ex.toml", tmp_path / "ex-out", jobs=2, progress=False).out
    index = fmt.read_index(out)
    split_of = {
        r["file"]: e.split for e in index.shards for r in index.section("ct")["records"][e.file]
    }
    assert (
        split_of["chest_000.npy"] == split_of["chest_001.npy"]
        and split_of["chest_002.npy"] == split_of["chest_003.npy"]
    )  # group = "folder": a patient's scans share a split
    assert all(r["shape"][0] == 256 for rs in index.section("ct")["records"].values() for r in rs)


def test_split_groups_by_folder(tmp_path: Path, ct_npy: Any) -> None:
    from pipeline.model import PlanContext

    vol = np.full((8, 8, 4), 40, np.int16)
    for p in range(8):
        for s in range(2):
            (tmp_path / "pts" / f"p{p}").mkdir(parents=True, exist_ok=True)
            np.save(tmp_path / "pts" / f"p{p}" / f"scan{s}.npy", vol)

    def splits(group: str, seed: int) -> dict[str, set[str]]:
        text = ct_npy.manifest(
            split=f'val_fraction = 0.0\ntest_fraction = 0.5\ngroup = "{group}"', path="pts/*/*.npy"
        )
        (tmp_path / "m.toml").write_text(text.replace("seed = 5", f"seed = {seed}"))
        m = load_manifest(tmp_path / "m.toml")
        kind = get_kind("ct")
        plan = kind.plan(m, kind.scan(m, None, None), PlanContext())
        out: dict[str, set[str]] = {}
        for sh in plan.shards:
            for k in sh.rows.tolist():
                out.setdefault(m.sources[k].path.parent.name, set()).add(sh.split)
        return out

    for seed in range(3):
        by_patient = splits("folder", seed)
        assert all(len(v) == 1 for v in by_patient.values())
        assert {s for v in by_patient.values() for s in v} == {"train", "test"}
    assert any(
        len(v) == 2 for seed in range(3) for v in splits("file", seed).values()
    )  # files alone do split
