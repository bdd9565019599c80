"""A spike manifest whose resolution the data contradicts builds with a warning that says so, and
``inspect`` shows frames per file: a swapped height and width read every file without an error
(the frame size is the same), so the summary must not show only the kept frames."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.modalities.spike.checks import frame_facts, resolution_hint, row_correlation
from pipeline.modalities.spike.demo import write_spike_demo
from tests import hostile

MANIFEST = """[dataset]
name = "s"
kind = "spike"
[[sources]]
path = "data/spike"
type = "dat"
[spike]
height = {h}
width = {w}
frames = 40
num_bins = 5
layout = "gopro"
"""


def _inspect(tmp_path: Path, h: int, w: int) -> dict:
    (tmp_path / f"m{h}.toml").write_text(MANIFEST.format(h=h, w=w))
    out = tmp_path / f"out{h}"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            str(tmp_path / f"m{h}.toml"),
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "pipeline", "inspect", str(out), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(res.stdout)


@pytest.mark.process
def test_the_declared_resolution_and_frames_per_file_are_shown(tmp_path: Path) -> None:
    write_spike_demo(tmp_path / "data")
    doc = _inspect(tmp_path, 64, 96)
    text = json.dumps(doc)
    assert "frames per file" in text and "check [spike] height and width" not in text


@pytest.mark.process
@hostile.parametrize
def test_a_swapped_resolution_is_flagged(case: hostile.Case, tmp_path: Path) -> None:
    write_spike_demo(tmp_path / "data")
    doc = _inspect(tmp_path, 96, 64)
    assert any(
        "width 96" in w and "check [spike] height and width" in w for w in doc["warnings"]
    ), doc
    assert "frames per file" in json.dumps(doc)


def test_row_correlation_tells_the_true_width() -> None:
    y, x = np.mgrid[0:40, 0:60]
    img = np.sin(x / 7.0) + np.cos(y / 5.0)
    flat = img.ravel()
    assert row_correlation(flat, 60) > 0.9
    assert row_correlation(flat, 40) < row_correlation(flat, 60)


def test_unequal_frame_counts_in_one_sequence_are_counted(tmp_path: Path) -> None:
    write_spike_demo(tmp_path / "data")
    dats = sorted((tmp_path / "data" / "spike").rglob("*.dat"))
    facts = frame_facts(
        [("a", dats[0], 40), ("a", dats[1], 41), ("b", dats[2], 40)], 64, 96, "bits"
    )
    assert facts["sequences_with_unequal_frames"] == ["a"]
    assert facts["frames_per_file"] == {"files": 3, "min": 40, "max": 41}
    assert resolution_hint(dats[0], 64, 96, "bits") is None
    hint = resolution_hint(dats[0], 96, 64, "bits")
    assert hint is not None and hint["better_width"] == 96
