"""The memory park (pipeline.parking): a big source's routed rows wait in the build's memory while
the budget allows, in spill files past it; the shards are the same bytes whichever way each read
task went, the budget is given back, and nothing is left behind when the build ends or fails."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pipeline.modalities.perturbation.assemble as assemble
import pipeline.modalities.perturbation.pack as pack
from loaders import format as fmt
from pipeline import parking
from pipeline.build import build


def test_budget_is_taken_and_given_back(tmp_path: Path) -> None:
    spill = tmp_path / ".spill-1"
    assert not parking.reserve(spill, 1)  # no park open: a task elsewhere spills
    parking.open_park(spill, 100)
    try:
        assert parking.reserve(spill, 60) and not parking.reserve(spill, 41)
        parking.put(spill, (0, 0), ["rows"])
        assert parking.in_use(spill) == (60, 1)
        assert parking.take(spill, (0, 0)) == ["rows"] and parking.take(spill, (0, 0)) is None
        parking.release(spill, 60)
        assert parking.reserve(spill, 100) and parking.in_use(spill) == (100, 0)
    finally:
        parking.close_park(spill)
    assert parking.in_use(spill) == (0, 0) and not parking.reserve(spill, 1)
    with pytest.raises(RuntimeError, match="build that owns it has ended"):
        parking.put(spill, (0, 0), ["rows"])


def _digests(out: Path) -> list[tuple[str, str]]:
    return [(e.file, e.digest) for e in fmt.read_index(out).shards]


@pytest.mark.parametrize("budget", ["all", "some"])
def test_parked_rows_make_the_same_bytes_as_spill_files(
    budget: str,
    split_source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    count_calls: Callable[..., list[int]],
) -> None:
    monkeypatch.setattr(parking, "PARK_BYTES", 0)
    build(split_source, tmp_path / "files", jobs=2, progress=False)
    parked = count_calls(pack, "park_range")
    spilled = count_calls(pack, "scatter_range")
    # "some": room for about one read task's rows, so the others spill
    monkeypatch.setattr(parking, "PARK_BYTES", 1 << 30 if budget == "all" else 30_000)
    build(split_source, tmp_path / "parked", jobs=2, progress=False)
    assert parked[0] >= 1 and (spilled[0] == 0 if budget == "all" else spilled[0] >= 1)
    assert _digests(tmp_path / "files") == _digests(tmp_path / "parked")
    assert not list((tmp_path / "parked").glob(".spill-*")) and not parking._PARKS


@pytest.mark.process
def test_other_processes_never_park(
    split_source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    count_calls: Callable[..., list[int]],
) -> None:
    """loky's tasks run in other processes: a row parked in one would be missing in the other."""
    monkeypatch.setattr(parking, "PARK_BYTES", 1 << 30)
    parked = count_calls(pack, "park_range")
    build(split_source, tmp_path / "loky", jobs=2, backend="loky", progress=False)
    assert parked[0] == 0
    build(split_source, tmp_path / "threads", jobs=2, progress=False)
    assert parked[0] >= 1 and _digests(tmp_path / "loky") == _digests(tmp_path / "threads")


def test_a_failed_build_leaves_no_park(
    split_source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    count_calls: Callable[..., list[int]],
) -> None:
    def broken(*a: Any, **k: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(assemble, "write_shard", broken)
    monkeypatch.setattr(parking, "PARK_BYTES", 1 << 30)
    parked = count_calls(pack, "park_range")
    with pytest.raises(OSError, match="disk gone"):
        build(split_source, tmp_path / "out", jobs=2, progress=False)
    assert parked[0] >= 1 and not parking._PARKS


def test_the_budget_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.errors import ShardsmithError

    monkeypatch.delenv(parking.ENV, raising=False)
    assert parking.budget(True) == parking.PARK_BYTES and parking.budget(False) == 0
    monkeypatch.setenv(parking.ENV, "512")
    assert parking.budget(True) == 512 << 20 and parking.budget(False) == 0
    monkeypatch.setenv(parking.ENV, "0")
    assert parking.budget(True) == 0
    for bad in ("-1", "lots", "nan", "inf"):
        monkeypatch.setenv(parking.ENV, bad)
        with pytest.raises(ShardsmithError, match="SHARDSMITH_PARK_MB.*expected MiB >= 0"):
            parking.budget(True)


def test_a_bad_budget_fails_the_build_before_any_work(
    split_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.cli import main

    monkeypatch.setenv(parking.ENV, "-5")
    assert main(["build", str(split_source), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert not (tmp_path / "o" / "index.json").exists()
