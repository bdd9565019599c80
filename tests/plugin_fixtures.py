"""The shared helpers of the tests that build no perturbation dataset, as fixtures: processes of
this checkout, loader batches, the independent CT reference, the CT tests' manifests and builds
(``ct``, ``ct_npy``). A pytest plug-in, registered by tests/conftest.py (``pytest_plugins``, next
to the dataset builders): tests take these as fixtures and never import this module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    import torch

    from loaders import ShardDataset

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TIMEOUT = 60  # seconds a worker may take for a batch: a hang fails the test instead of blocking it


# -- processes of this checkout -----------------------------------------------------------------
@dataclass(frozen=True)
class Checkout:
    """Fresh interpreters importing this checkout: real processes, for locks and kills."""

    root: Path = ROOT
    env: dict[str, str] = field(default_factory=lambda: dict(ENV))

    def python(
        self, code: str, *args: str, check: bool = False, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a fresh interpreter."""
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.root,
            check=check,
            timeout=timeout,
        )

    def popen(self, code: str, *args: str) -> subprocess.Popen[str]:
        return self._popen("-c", code, *args)

    def cli(self, *args: str) -> subprocess.Popen[str]:
        """`shardsmith ARGS` as its own process."""
        return self._popen("-m", "pipeline", *args)

    def _popen(self, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.root,
        )


# -- loading ------------------------------------------------------------------------------------
def check_cells(batch: dict[str, torch.Tensor], truth: Any) -> None:
    """A batch of cells holds what build_dataset(stage="shards") wrote (``Dataset.truth``)."""
    import torch

    ids = batch["sample_id"].numpy()
    np.testing.assert_array_equal(batch["X"].numpy(), truth.dense[ids])
    np.testing.assert_array_equal(batch["cond_id"].numpy(), truth.cond_id[ids])
    np.testing.assert_array_equal(batch["cond"].numpy(), truth.vectors[truth.cond_id[ids]])
    for f in truth.obs:  # every obs field written
        assert batch[f].dtype == torch.int64
        np.testing.assert_array_equal(batch[f].numpy(), truth.obs[f][ids])
    np.testing.assert_array_equal(batch["obsm/pca"].numpy(), truth.pca[ids])


def broken_copy(ds: Any, dst: Path, how: str) -> Path:
    """A copy of a stage="shards" dataset whose shard 3 (train) is "missing" or "corrupt"."""
    shutil.copytree(ds.root, dst)
    shard = dst / "shards" / "shard-00003.zarr"  # a train shard
    if how == "missing":
        shutil.rmtree(shard)
    else:
        chunks = sorted(
            p for p in (shard / "X" / "data").rglob("*") if p.is_file() and p.name != "zarr.json"
        )
        chunks[0].write_bytes(b"\x00garbage" * 5)
    return shard


def started(ds: ShardDataset) -> ShardDataset:
    """Wait until the dataset's decoder process is up, so that every window goes through it."""
    dec = ds.engine_here().decoder()
    assert dec is not None
    deadline = time.monotonic() + TIMEOUT
    while not dec.ready():
        assert time.monotonic() < deadline, "decoder process did not start"
        time.sleep(0.01)
    return ds


def batches(
    ds: ShardDataset, epochs: tuple[int, ...] = (0, 1), **kw: object
) -> list[dict[str, torch.Tensor]]:
    from loaders import ShardLoader

    dl = ShardLoader(ds, timeout=TIMEOUT, **kw)  # type: ignore[arg-type]
    out = []
    for e in epochs:
        dl.set_epoch(e)
        out += list(dl)
    return out


def assert_same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k].numpy(), y[k].numpy(), err_msg=k)


# -- the independent CT reference (pinned to hand-made volumes by tests/test_ct_reference.py) ---
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


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="session", name="check_cells")
def check_cells_fixture() -> Callable[..., Any]:
    """check_cells(batch, truth): a batch of cells is exact."""
    return check_cells


@pytest.fixture(scope="session", name="broken_copy")
def broken_copy_fixture() -> Callable[..., Any]:
    """broken_copy(ds, dst, how) -> the damaged shard's path."""
    return broken_copy


@pytest.fixture(scope="session", name="started")
def started_fixture() -> Callable[..., Any]:
    """started(ds) -> ds, once its decoder process is up."""
    return started


@pytest.fixture(scope="session", name="batches")
def batches_fixture() -> Callable[..., Any]:
    """batches(ds, epochs, **loader_kw) -> those epochs' batches."""
    return batches


@pytest.fixture(scope="session", name="assert_same")
def assert_same_fixture() -> Callable[..., Any]:
    """assert_same(a, b): two lists of batches are equal."""
    return assert_same


@pytest.fixture(scope="session", name="reference_body")
def reference_body_fixture() -> Callable[..., Any]:
    """reference_body(hu, ...) -> the CT body mask."""
    return reference_body


@pytest.fixture(scope="session", name="reference_points")
def reference_points_fixture() -> Callable[..., Any]:
    """reference_points(hu, ...) -> CT points."""
    return reference_points


@pytest.fixture(scope="session")
def checkout() -> Checkout:
    """Fresh interpreters importing this checkout: ``.python(code, *args)``, ``.popen``, ``.cli``,
    ``.root``, ``.env``."""
    return Checkout()


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


# -- CT from .npy volumes (tests/test_ct_pipeline*.py) ------------------------------------------
CT_NPY_MANIFEST = """
[dataset]
name = "ct-test"
kind = "ct"
format = "{fmt}"
seed = 5
shard_size_mb = 0.05

[[sources]]
path = "{path}"                # no type: "npy" is inferred from the suffix among kind ct's sources

[ct]
max_points = {max_points}
{extra}

[split]
{split}
"""
NO_HOLDOUT = "val_fraction = 0.0\ntest_fraction = 0.0"


def npy_manifest(
    fmt_: str = "zarr",
    max_points: int = 0,
    extra: str = "",
    split: str = NO_HOLDOUT,
    path: str = "vols/*.npy",
) -> str:
    return CT_NPY_MANIFEST.format(
        fmt=fmt_, max_points=max_points, extra=extra, split=split, path=path
    )


def npy_make(
    root: Path,
    fmt_: str = "zarr",
    max_points: int = 0,
    extra: str = "",
    jobs: int = 2,
    out: str = "out",
    path: str = "vols/*.npy",
) -> Path:
    from pipeline.build import build

    (root / "m.toml").write_text(npy_manifest(fmt_, max_points, extra, path=path))
    build(root / "m.toml", root / out, jobs=jobs, progress=False)
    return root / out


@pytest.fixture(scope="session")
def ct_npy() -> Any:
    """The CT .npy pipeline tests' helpers: ``ct_npy.manifest(fmt_, max_points, extra, split,
    path)`` -> the manifest's text (``split``: ``ct_npy.NO_HOLDOUT`` unless given);
    ``ct_npy.make(root, fmt_, max_points, extra, jobs, out, path)`` writes it to root/m.toml and
    builds it into root/<out>."""
    return SimpleNamespace(manifest=npy_manifest, make=npy_make, NO_HOLDOUT=NO_HOLDOUT)
