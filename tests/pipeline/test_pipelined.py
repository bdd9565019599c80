"""With $SHARDSMITH_PIPELINE_PLAN=1, a first build with two sources a job or more plans each source
while the earlier ones are packed (pipeline.pipelined): same bytes as the plan-first build, the plan
really overlaps the pack, never more than `jobs` threads of work, and a failure on either side ends
the build cleanly. Unset (the default), builds plan first."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.errors import ShardsmithError
from pipeline.events import EventLog
from pipeline.modalities.perturbation import pack, plan
from pipeline.pipelined import ENV

SOURCES = 5


@pytest.fixture(autouse=True)
def pipeline_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")


@pytest.fixture
def manifest(tmp_path: Path, build_dataset: Callable[..., Any]) -> Path:
    """SOURCES small sources (each one pack task) and a manifest over them."""
    return build_dataset(
        tmp_path, "manifest", sources=SOURCES, cells=240, genes=40, perts=4
    ).manifest


def _files(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
    }


def _planned(ev: EventLog) -> dict[str, Any]:
    (doc,) = [e for e in ev.events if e["event"] == "planned"]
    return doc


@pytest.mark.parametrize("fmt_name", ["zarr", "tar"])
def test_pipelined_build_equals_the_plan_first_build(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt_name: str
) -> None:
    ev = EventLog()
    build(manifest, tmp_path / "a", jobs=2, progress=False, encoding=fmt_name, events=ev)
    assert _planned(ev).get("pipelined") is True
    monkeypatch.setenv(ENV, "0")
    ev = EventLog()
    build(manifest, tmp_path / "b", jobs=2, progress=False, encoding=fmt_name, events=ev)
    assert "pipelined" not in _planned(ev)
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a.keys() == b.keys() and "index.json" in a
    assert [k for k in a if a[k] != b[k]] == []
    assert len(fmt.read_index(tmp_path / "a").shards) >= SOURCES


def test_only_first_builds_with_enough_sources_are_pipelined(
    manifest: Path, tmp_path: Path
) -> None:
    """One job, or a rebuild (reuse needs every key first): planned first, as before."""
    pipelined = {}
    for jobs in (1, 2):
        ev = EventLog()
        build(manifest, tmp_path / f"out{jobs}", jobs=jobs, progress=False, events=ev)
        pipelined[jobs] = _planned(ev).get("pipelined", False)
    assert pipelined == {1: False, 2: True}
    ev = EventLog()
    build(manifest, tmp_path / "out2", jobs=2, progress=False, events=ev, rehash=True)
    assert "pipelined" not in _planned(ev)


class Watch:
    """Records the work going on: plan steps and pack tasks, how many at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.busy = self.most = self.planned = 0
        self.packed_before_last_plan = False
        self.pack_started = threading.Event()

    def enter(self) -> None:
        with self.lock:
            self.busy += 1
            self.most = max(self.most, self.busy)

    def leave(self) -> None:
        with self.lock:
            self.busy -= 1


def _watched(monkeypatch: pytest.MonkeyPatch, watch: Watch) -> None:
    plan_source, fused = plan.plan_source, pack._fused

    def planning(*a: Any, **k: Any) -> Any:
        watch.enter()
        try:
            watch.planned += 1
            if watch.planned == SOURCES:  # the last source: has any shard been packed yet?
                watch.leave()
                watch.packed_before_last_plan = watch.pack_started.wait(5)
                watch.enter()
            return plan_source(*a, **k)
        finally:
            watch.leave()

    def packing(*a: Any, **k: Any) -> Any:
        watch.enter()
        watch.pack_started.set()
        try:
            time.sleep(0.1)  # long enough for a third thread of work to show, were there one
            return fused(*a, **k)
        finally:
            watch.leave()

    monkeypatch.setattr(plan, "plan_source", planning)
    monkeypatch.setattr(pack, "_fused", packing)


def test_the_plan_overlaps_the_pack_within_the_jobs(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watch = Watch()
    _watched(monkeypatch, watch)
    build(manifest, tmp_path / "out", jobs=2, progress=False)
    assert watch.planned == SOURCES
    assert watch.packed_before_last_plan  # a plan-first build packs nothing before
    assert watch.most == 2  # the plan is one of the 2 jobs: never a third thread of work


def test_plan_first_build_does_not_overlap(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instrument above can see the difference: with the pipeline off, no overlap."""
    watch = Watch()
    _watched(monkeypatch, watch)
    monkeypatch.setenv(ENV, "0")
    monkeypatch.setattr(
        watch.pack_started, "wait", lambda timeout=None: watch.pack_started.is_set()
    )
    build(manifest, tmp_path / "out", jobs=2, progress=False)
    assert not watch.packed_before_last_plan


def test_a_plan_error_fails_the_build_and_a_rerun_finishes_it(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan_source = plan.plan_source

    def third_fails(manifest: Any, src: Any, *a: Any, **k: Any) -> Any:
        if src.ordinal == 2:
            raise ValueError("planning source 2 broke")
        return plan_source(manifest, src, *a, **k)

    monkeypatch.setattr(plan, "plan_source", third_fails)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="planning source 2 broke"):
        build(manifest, out, jobs=2, progress=False)
    assert not (out / "index.json").exists()
    assert not [t for t in threading.enumerate() if t.name == "plan"]
    monkeypatch.setattr(plan, "plan_source", plan_source)
    build(manifest, out, jobs=2, progress=False)
    monkeypatch.setenv(ENV, "0")
    build(manifest, tmp_path / "ref", jobs=2, progress=False)
    assert fmt.read_index(out).raw == fmt.read_index(tmp_path / "ref").raw


def test_a_pack_error_stops_the_planner(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned: list[int] = []
    plan_source = plan.plan_source

    def counting(manifest: Any, src: Any, *a: Any, **k: Any) -> Any:
        planned.append(src.ordinal)
        time.sleep(0.2)  # the first task fails long before the last source is planned
        return plan_source(manifest, src, *a, **k)

    def broken(*a: Any, **k: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(plan, "plan_source", counting)
    monkeypatch.setattr(pack, "_fused", broken)
    with pytest.raises(OSError, match="disk gone"):
        build(manifest, tmp_path / "out", jobs=2, progress=False)
    assert not [t for t in threading.enumerate() if t.name == "plan"]
    assert len(planned) < SOURCES
    assert not (tmp_path / "out" / "index.json").exists()


def test_builds_plan_first_unless_asked(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV)
    ev = EventLog()
    build(manifest, tmp_path / "out", jobs=2, progress=False, events=ev)
    assert "pipelined" not in _planned(ev)
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ShardsmithError, match=f"{ENV}='yes'"):
        build(manifest, tmp_path / "bad", jobs=2, progress=False)
    assert not (tmp_path / "bad").exists()


def test_the_planner_drops_the_written_condition_vectors(
    manifest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipelined build writes the condition vectors before it plans the sources; the planner
    then drops them (27 MB at 2M cells, held beside every source's plan otherwise). The bytes are
    those of the plan-first build (test above)."""
    from pipeline.modalities.perturbation.conditions import ConditionTable

    held: list[bool] = []
    drop = ConditionTable.drop_vectors

    def spy(self: ConditionTable) -> None:
        held.append("vectors" in self.__dict__)
        drop(self)
        assert "vectors" not in self.__dict__

    monkeypatch.setattr(ConditionTable, "drop_vectors", spy)
    build(manifest, tmp_path / "out", jobs=2, progress=False)
    assert held == [True]
