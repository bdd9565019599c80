"""What a new user tripped on, trying shardsmith on real files: each trip is caught where it
happens, with the fix in the message, or no longer happens. The cases are the rows of
``tests/hostile/first_use.py``."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from pipeline import __version__
from pipeline.cli import main
from pipeline.errors import ManifestError, SourceError
from tests import hostile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]) -> Any:
    return build_dataset(tmp_path_factory.mktemp("first-use"), sources=1, cells=120, genes=20)


def _batchsize(small: Any, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"unknown option 'batchsize'; did you mean 'batch_size'"):
        ShardDataset(small.out, batchsize=64)


def _num_workers(small: Any, tmp_path: Path) -> None:
    with pytest.raises(
        TypeError, match=r"'num_workers' is an option of ShardLoader.*num_workers=2"
    ):
        ShardDataset(small.out, num_workers=2)
    ShardLoader(ShardDataset(small.out, batch_size=8, decode_process=False), num_workers=0)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )


def _stdout(small: Any, tmp_path: Path) -> None:
    m, out = str(small.manifest), str(tmp_path / "o")
    plain = _cli("build", m, "--out", out, "--no-progress", "--jobs", "1", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("built ") and '"event"' not in plain.stdout, plain.stdout
    asked = _cli("build", m, "--out", out, "--no-progress", "--json", cwd=tmp_path)
    assert asked.returncode == 0 and len(asked.stdout.strip().splitlines()) == 1, asked.stdout
    assert json.loads(asked.stdout)["status"] == "ok" and "built " in asked.stderr
    quiet = _cli("-q", "build", m, "--out", out, "--no-progress", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stdout == "", quiet.stdout


def _demo_again(small: Any, tmp_path: Path) -> None:
    import shutil

    from pipeline.commands.demo import write_demo

    write_demo(tmp_path / "data" / "demo")
    (tmp_path / "m").mkdir()
    shutil.copy(REPO / "data_manifests" / "demo.toml", tmp_path / "m" / "demo.toml")
    args = ["build", str(tmp_path / "m" / "demo.toml"), "--out", str(tmp_path / "out")]
    assert main([*args, "--no-progress", "-q"]) == 0
    before = (tmp_path / "out" / "index.json").read_bytes()
    write_demo(tmp_path / "data" / "demo")  # the same bytes, new mtimes (and inodes)
    res = __import__("pipeline.build", fromlist=["build"]).build(
        tmp_path / "m" / "demo.toml", tmp_path / "out", jobs=1, progress=False
    )
    assert not res.written and res.reused and not res.changed, res
    assert (tmp_path / "out" / "index.json").read_bytes() == before
    res = __import__("pipeline.build", fromlist=["build"]).build(
        tmp_path / "m" / "demo.toml", tmp_path / "out", jobs=1, progress=False
    )
    assert not res.changed and res.seconds.get("total", 0) >= 0  # the stat cache learnt the stats


def _float16(small: Any, tmp_path: Path) -> None:
    from pipeline.modalities.perturbation.validate import check_float32_exact

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning fails the test
        assert check_float32_exact(np.array([[1, 2], [0, 7]], np.float16), "x", 0, None, True)
        with pytest.raises(SourceError, match=r"row 1: value .* beyond 2\*\*24"):
            check_float32_exact(np.array([[1.0], [2.0**25]]), "x", 0, None, True)


def _lightning(small: Any, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from lightning.pytorch.utilities.model_helpers import is_overridden

    from loaders.lightning import ShardDataModule

    train_only = ShardDataModule(small.out, sample="cells", splits=["train"])
    assert not is_overridden("val_dataloader", train_only)
    assert not is_overridden("test_dataloader", train_only)
    every = ShardDataModule(small.out, sample="cells")
    assert is_overridden("val_dataloader", every) and is_overridden("test_dataloader", every)


def _version(small: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["-V"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"shardsmith {__version__}"


def _raw(small: Any, tmp_path: Path) -> None:
    import anndata as ad
    import scipy.sparse as sp

    from pipeline.modalities.perturbation.h5ad import H5adSource

    a = ad.AnnData(sp.random(6, 4, density=0.5, format="csr", dtype=np.float32))
    a.raw = a
    a.write_h5ad(tmp_path / "r.h5ad")
    with pytest.raises(SourceError, match=r'did you mean matrix = "raw/X"\?'):
        H5adSource(tmp_path / "r.h5ad", matrix="raw").meta([])


def _nope(small: Any, tmp_path: Path) -> None:
    from pipeline.manifest import load_manifest

    with pytest.raises(ManifestError) as e:
        load_manifest(tmp_path / "nope.toml")
    assert str(e.value).startswith(f"{tmp_path / 'nope.toml'}: cannot read manifest"), e.value
    assert "[-]" not in str(e.value)


def _docs(small: Any, tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    ct = (REPO / "docs" / "CT.md").read_text()
    loader = (REPO / "docs" / "LOADER.md").read_text()
    for text in (readme, ct):
        assert "max_points" in text and "500" in text and "28%" in text and "1.77M" in text
    assert (
        "torchsparse >= 2.1" in ct and "batch-first" not in ct.split("torchsparse >= 2.1")[0][-5:]
    )
    assert "ddp_spawn" in loader and "ModelCheckpoint" in loader


TRIPS: dict[str, Callable[..., None]] = {
    "batchsize": _batchsize,
    "num_workers": _num_workers,
    "stdout": _stdout,
    "demo-again": _demo_again,
    "float16": _float16,
    "lightning": _lightning,
    "-V": _version,
    "raw": _raw,
    "nope": _nope,
    "docs": _docs,
}


@pytest.mark.process
@hostile.parametrize
def test_a_first_users_trip_is_caught(
    case: hostile.Case, small: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trip = TRIPS[case.data]
    if "capsys" in inspect.signature(trip).parameters:
        trip(small, tmp_path, capsys)
    else:
        trip(small, tmp_path)


def test_the_loader_options_list_is_shardloaders() -> None:
    """``loaders.options.LOADER_OPTIONS`` (torch-free) names exactly ShardLoader's keywords."""
    from loaders.options import LOADER_OPTIONS

    params = [p for p in inspect.signature(ShardLoader.__init__).parameters if p != "self"]
    assert sorted(LOADER_OPTIONS) == sorted(set(params) - {"dataset"})
