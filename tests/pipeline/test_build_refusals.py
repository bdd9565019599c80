"""Builds that used to commit over a good dataset and exit 0 are refused with exit 2, leaving
``--out`` as it was (issue 25, items 3 and 4).

* A build that keeps no record (every CT volume skipped because it is normalised to [0, 1] or
  stored as uint8; spike ``frames`` longer than the files) committed an empty dataset with
  ``"status": "ok"``: the README promises that bad input exits non-zero and leaves the previous
  dataset untouched.
* A manifest of another dataset (another name or kind) built into an existing dataset's
  ``--out`` replaced it with one warning line; now only ``--replace`` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loaders import format as fmt
from pipeline.cli import main
from pipeline.errors import EXIT_BAD_INPUT, EXIT_OK
from pipeline.modalities.ct.demo import make_chest_volume
from pipeline.modalities.spike.demo import write_spike_demo
from tests import hostile

CT = """[dataset]
name = "{name}"
kind = "ct"
[[sources]]
path = "{folder}/*.npy"
"""
SPIKE = """[dataset]
name = "{name}"
kind = "spike"
[[sources]]
path = "spike"
type = "dat"
[spike]
height = 64
width = 96
frames = {frames}
num_bins = 5
layout = "gopro"
"""


def _ct_volumes(root: Path, folder: str, how: str) -> None:
    """Two small chest volumes: in HU (``good``), normalised to [0, 1] or exported as uint8."""
    (root / folder).mkdir(parents=True, exist_ok=True)
    for i in range(2):
        hu, _ = make_chest_volume((40, 40, 24), seed=i)
        unit = (hu.astype(np.float32) + 1024) / 4095
        vol = {"good": hu, "normalised": unit, "uint8": (unit * 255).astype(np.uint8)}[how]
        np.save(root / folder / f"v{i}.npy", vol)


def _manifest(root: Path, kind: str, how: str, name: str = "d") -> Path:
    """A manifest of ``kind`` over good or ``how``-bad sources (written once per root)."""
    path = root / f"{kind}-{how}-{name}.toml"
    if kind == "ct":
        _ct_volumes(root, how, how)
        path.write_text(CT.format(name=name, folder=how))
    else:
        if not (root / "spike").exists():
            write_spike_demo(root)
        path.write_text(SPIKE.format(name=name, frames=400 if how == "frames" else 10))
    return path


def _build(manifest: Path, out: Path, *extra: str) -> int:
    return main(["build", str(manifest), "--out", str(out), "--jobs", "1", "--no-progress", *extra])


def _snapshot(out: Path) -> dict[str, bytes | None]:
    if not out.exists():
        return {}
    return {
        str(p.relative_to(out)): p.read_bytes() if p.is_file() else None
        for p in sorted(out.rglob("*"))
    }


@hostile.parametrize
def test_a_build_that_keeps_no_record_commits_nothing(
    case: hostile.Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kind, bad, over_good = case.data
    out = tmp_path / "out"
    if over_good:
        assert _build(_manifest(tmp_path, kind, "good"), out) == EXIT_OK
        assert fmt.read_index(out).shards
    before = _snapshot(out)
    capsys.readouterr()
    rc = _build(_manifest(tmp_path, kind, bad), out, "--json")
    captured = capsys.readouterr()
    assert rc == EXIT_BAD_INPUT, captured.err
    reason = "fewer points than min_points" if kind == "ct" else "fewer frames than [spike] frames"
    assert "kept no record" in captured.err and f"x '{reason}" in captured.err, captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert (summary["status"], summary["exit_code"]) == ("failed", EXIT_BAD_INPUT)
    # the good dataset untouched (same files, same bytes); a first build leaves no folder
    assert _snapshot(out) == before
    assert out.exists() == over_good


@hostile.parametrize
def test_another_dataset_in_out_is_refused_unless_replace(
    case: hostile.Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held, kind, same_name = case.data
    out = tmp_path / "out"
    first = _manifest(tmp_path, held, "good", name="first")
    assert _build(first, out) == EXIT_OK
    assert _build(first, out) == EXIT_OK, "a rebuild of the same dataset is unaffected"
    other = _manifest(tmp_path, kind, "good", name="first" if same_name else "second")
    before = _snapshot(out)
    capsys.readouterr()
    assert _build(other, out) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    want = f"holds dataset 'first' (kind {held})"
    assert want in err and f"kind {kind})" in err and "--replace" in err, err
    assert _snapshot(out) == before, "nothing changed"
    assert _build(other, out, "--replace") == EXIT_OK
    index = fmt.read_index(out)
    assert (index.name, index.kind) == ("first" if same_name else "second", kind)
