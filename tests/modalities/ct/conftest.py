"""Fixtures of the CT tests (tests/modalities/ct/): the independent CT reference, and the manifests,
builds and reads of the CT-format tests (``ct``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest


# -- the independent CT reference (pinned to hand-made volumes by tests/modalities/ct/test_ct_reference.py) ---
def reference_body(
    hu: np.ndarray, threshold: float = -500.0, axial_axis: int = -1, fill_3d: bool = False
) -> np.ndarray:
    """Threshold, the largest component (``ndimage.label``, ``bincount``), holes filled slice by
    axial slice (``binary_fill_holes`` in a Python loop)."""
    from scipy import ndimage

    m = hu > threshold
    lab, n = ndimage.label(m)
    if n:
        m = lab == (np.argmax(np.bincount(lab.ravel())[1:]) + 1)
    if fill_3d:  # the pitfall the issue warns about, kept for a test that shows it
        return ndimage.binary_fill_holes(m)
    m = np.moveaxis(m, axial_axis, 0).copy()
    for i in range(m.shape[0]):
        m[i] = ndimage.binary_fill_holes(m[i])
    return np.moveaxis(m, 0, axial_axis)


def reference_points(
    hu: np.ndarray,
    level: float = -600.0,
    width: float = 1500.0,
    band: tuple[float, float] | None = (-1000.0, -400.0),
    body: bool = True,
    threshold: float = -500.0,
    axial_axis: int = -1,
    fill_3d: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(coords uint16 [N,3], hu int16 [N], window float16 [N])`` of an int16 HU volume, the
    obvious whole-volume way: no slabs, no shared label buffer, no lookup table."""
    lo, hi = level - width / 2, level + width / 2
    keep = (hu >= lo) & (hu <= hi)
    if band is not None:
        keep &= (hu >= band[0]) & (hu <= band[1])
    if body:
        keep &= reference_body(hu, threshold, axial_axis, fill_3d)
    coords = np.argwhere(keep)
    vals = hu[keep]
    window = np.clip((vals.astype(np.float32) - np.float32(lo)) / np.float32(width), 0, 1)
    return coords.astype(np.uint16), vals.astype(np.int16), window.astype(np.float16)


@pytest.fixture(scope="session", name="reference_body")
def reference_body_fixture() -> Callable[..., Any]:
    """reference_body(hu, ...) -> the CT body mask."""
    return reference_body


@pytest.fixture(scope="session", name="reference_points")
def reference_points_fixture() -> Callable[..., Any]:
    """reference_points(hu, ...) -> CT points."""
    return reference_points


# -- CT sources other than .npy (tests/test_ct_formats*.py) ----------------------------------
CT_REPO = Path(__file__).resolve().parents[1]
CT_HEAD = """[dataset]
name = "fmt"
kind = "ct"
format = "{fmt}"
seed = 4
shard_size_mb = 0.05
"""
CT_TAIL = """
[ct]
max_points = {cap}
{extra}

[split]
val_fraction = 0.0
test_fraction = 0.0
"""


def manifest(
    root: Path, sources: list[str], cap: int = 0, extra: str = "", fmt_: str = "zarr"
) -> Path:
    """``sources``: one ``[[sources]]`` body each (``path = ...`` lines)."""
    text = CT_HEAD.format(fmt=fmt_) + "".join(f"\n[[sources]]\n{s}\n" for s in sources)
    (root / "m.toml").write_text(text + CT_TAIL.format(cap=cap, extra=extra))
    return root / "m.toml"


def served(root: Path, **kw: Any) -> dict[str, dict[str, np.ndarray]]:
    """file name -> what the loader serves for it (coords without the batch column, feats,
    geometry)."""
    from loaders import ShardDataset  # noqa: I001 - torch, only for the tests that load
    from loaders import format as fmt

    index = fmt.read_index(root)
    out = {}
    for b in ShardDataset(root, split="train", sample="ct", batch_size=1, shuffle=False, **kw):
        name = Path(index.sources[int(b["sample_id"][0])]["path"]).name
        out[name] = {
            k: v[0].numpy() if k in ("affine", "spacing") else v.numpy() for k, v in b.items()
        }
        out[name]["coords"] = out[name]["coords"][:, 1:]
    return out


def cli_build(manifest_: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            str(manifest_),
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=CT_REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="session")
def ct() -> Any:
    """The CT-format tests' helpers: ``ct.manifest(root, sources, ...)``, ``ct.served(root)``,
    ``ct.cli_build(manifest, out)``."""
    return SimpleNamespace(manifest=manifest, served=served, cli_build=cli_build)
