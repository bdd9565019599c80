"""The fixtures that tests in several folders share and the root conftest.py has no room for (it
holds the dataset builders): loader batches compared, the CT .npy builds (``ct_npy``), a gloo world
of spawned ranks (``gloo_world``), and the pack-path fixtures (``split_source``, ``count_calls``). A
pytest plug-in registered by tests/conftest.py (``pytest_plugins``): tests take these as fixtures
and never import this module. Fixtures of one folder live in that folder's conftest.py.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch.multiprocessing as tmp

if TYPE_CHECKING:
    import torch

    from loaders import ShardDataset

TIMEOUT = 60  # seconds a worker may take for a batch: a hang fails the test instead of blocking it


# -- loading ------------------------------------------------------------------------------------
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


@pytest.fixture(scope="session", name="batches")
def batches_fixture() -> Callable[..., Any]:
    """batches(ds, epochs, **loader_kw) -> those epochs' batches."""
    return batches


@pytest.fixture(scope="session", name="assert_same")
def assert_same_fixture() -> Callable[..., Any]:
    """assert_same(a, b): two lists of batches are equal."""
    return assert_same


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


# -- a gloo world ----------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the world's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(main: Callable[..., None], world: int, *args: Any, deadline: float) -> None:
    """Run ``main(rank, world, port, *args)`` in ``world`` spawned processes; fail the test when
    they have not all finished within ``deadline`` seconds (and kill the ones still alive)."""
    ctx = tmp.start_processes(
        main, args=(world, free_port(), *args), nprocs=world, join=False, start_method="spawn"
    )
    end = time.monotonic() + deadline
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > end:
                pytest.fail(f"a world of {world} ranks did not finish within {deadline}s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()


@pytest.fixture
def gloo_world() -> Callable[..., None]:
    """:func:`run_world`: ``gloo_world(main, world, *args, deadline=...)``."""
    return run_world


# -- the pack path --------------------------------------------------------------------------------
@pytest.fixture
def split_source(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> Path:
    """A manifest over one 600-cell source read by several row-range tasks, then packed shard by
    shard (what a single big source gets: spill files, or the memory park where it has room)."""
    import pipeline.modalities.perturbation.pack as pack  # import weight: these tests only

    build_dataset(tmp_path, "sources", sources=1, cells=600)
    monkeypatch.setattr(pack, "FUSE_BYTES", 0)
    monkeypatch.setattr(pack, "SCATTER_BYTES", 20_000)
    return write_manifest(tmp_path / "m.toml", shard_size_mb=0.01)


@pytest.fixture
def count_calls(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[int]]:
    """``count_calls(module, name) -> [calls]``: ``module.name`` replaced, for this test, by a
    wrapper that counts its calls (the list is updated in place)."""

    def wrap(module: Any, name: str) -> list[int]:
        calls = [0]
        real = getattr(module, name)

        def counted(*a: Any, **k: Any) -> Any:
            calls[0] += 1
            return real(*a, **k)

        monkeypatch.setattr(module, name, counted)
        return calls

    return wrap
