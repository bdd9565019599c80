"""Fixtures of the tests of a build's pack path (spill files, the memory park, narrowed spills): a
source big enough, by the pack's settings, to be read by several tasks, and a call counter that
tells which path a build took. A pytest plug-in, registered by tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


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
