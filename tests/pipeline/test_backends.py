"""Cluster backends build the same bytes as threads: a dask LocalCluster (2 worker processes on
127.0.0.1) and a local ray; tasks are sent paths and row ranges, not arrays; a worker lost
mid-build costs only its running task; a rerun after a failed build writes only the shards that
are missing."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pipeline.modalities.perturbation.pack
from loaders import format as fmt
from pipeline.backends import BackendError, get_backend
from pipeline.build import build
from pipeline.events import EventLog
from pipeline.taskspill import ArrayRef, describe

needs_dask = pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None,
    reason="dask[distributed] not installed (pip install 'shardsmith[dask]')",
)
needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray not installed (pip install 'shardsmith[ray]'; no wheel on some platforms)",
)
if importlib.util.find_spec("distributed") is not None:
    from distributed import WorkerPlugin
else:  # the dask tests skip
    WorkerPlugin = object
DESCRIPTOR_LIMIT = 16 << 10  # what one task may be sent: settings, paths, row ranges


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory,
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> tuple[Path, Path]:
    """Two small sources, the spill path forced (several row-range read tasks per source, then pack
    tasks), built with the default backend."""
    root = tmp_path_factory.mktemp("backends")
    build_dataset(root, "sources", sources=2, cells=300)
    manifest = write_manifest(root / "m.toml")
    with pytest.MonkeyPatch.context() as mp:
        _force_spill(mp)
        build(manifest, root / "threads", jobs=2, progress=False)
    return manifest, root / "threads"


def _force_spill(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(pipeline.modalities.perturbation.pack, "FUSE_BYTES", 0)
    mp.setattr(pipeline.modalities.perturbation.pack, "SCATTER_BYTES", 40_000)


def _same_bytes(a: Path, b: Path) -> None:
    assert fmt.index_path(a).read_bytes() == fmt.index_path(b).read_bytes()
    for e in fmt.read_index(a).shards:
        assert fmt.content_hash(a / fmt.SHARDS_DIR / e.file) == fmt.content_hash(
            b / fmt.SHARDS_DIR / e.file
        )


def _cluster_build(
    backend: str, reference: tuple[Path, Path], out: Path, mp: pytest.MonkeyPatch
) -> EventLog:
    manifest, _ = reference
    _force_spill(mp)  # read in this process (the budget is read into PackConfig at build time)
    ev = EventLog()
    build(manifest, out, jobs=2, backend=backend, progress=False, events=ev)
    return ev


def _check_descriptors(ev: EventLog) -> None:
    tasks = [e for e in ev.events if e["event"] == "tasks"]
    assert {e["phase"] for e in tasks} == {"read sources", "pack shards"}
    assert all(0 < e["max_descriptor_bytes"] < DESCRIPTOR_LIMIT for e in tasks), tasks


@pytest.mark.cluster
@needs_ray
def test_ray_builds_the_same_bytes(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ev = _cluster_build("ray", reference, tmp_path / "ray", monkeypatch)
    _same_bytes(reference[1], tmp_path / "ray")
    _check_descriptors(ev)


def test_descriptors_carry_paths_not_arrays(tmp_path: Path) -> None:
    """The spill of task arguments: arrays become .npy files (loaded without pickle), equal ones
    once."""
    from functools import partial

    rows = np.arange(10_000, dtype=np.int64)
    tasks = [partial(np.sum, rows), partial(np.array_equal, rows, rows)]
    d = describe(tasks, tmp_path / "t")
    assert isinstance(d[0].args[0], ArrayRef) and d[0].args[0] == d[1].args[0] == d[1].args[1]
    assert len(list((tmp_path / "t").iterdir())) == 1
    assert d[0]() == rows.sum() and d[1]()


def test_unknown_backend_or_stray_scheduler_is_bad_input() -> None:
    with pytest.raises(BackendError, match="known: threading"):
        get_backend("spark", 2)
    with pytest.raises(BackendError, match="--scheduler"):
        get_backend("threading", 2, "tcp://10.0.0.1:8786")


@pytest.mark.process
@pytest.mark.cluster
@needs_dask
def test_dask_local_cluster_builds_the_same_bytes_though_a_worker_dies(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --scheduler: a LocalCluster of 2 worker processes. One worker dies as it starts the first
    pack task; the cluster reruns that task elsewhere and the build still gives the default
    backend's bytes."""
    kill_once = tmp_path / "killed"
    real_start = pipeline.backends.DaskBackend.start

    def start(self: pipeline.backends.DaskBackend) -> None:
        real_start(self)
        assert self.cluster is not None and len(self.cluster.workers) == 2
        self.client.register_plugin(_Killer("", str(kill_once)), name="kill-once")

    monkeypatch.setattr(pipeline.backends.DaskBackend, "start", start)
    ev = _cluster_build("dask", reference, tmp_path / "out", monkeypatch)
    assert kill_once.exists(), "no worker was killed: the test did not test anything"
    _same_bytes(reference[1], tmp_path / "out")
    _check_descriptors(ev)
    assert not list((tmp_path / "out").glob(".spill-*"))


@pytest.mark.cluster
@needs_dask
def test_rerun_after_a_failed_build_writes_only_missing_shards(
    reference: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    shard_files: Callable[..., Any],
) -> None:
    """Every attempt of one pack task kills its worker: the build fails (nothing committed) after
    the other shards are written. The rerun (no more killing) writes only the missing shard and
    reads nothing for the others."""
    manifest, ref = reference
    out = tmp_path / "out"
    target = sorted(e.file for e in fmt.read_index(ref).shards)[0]
    real_start = pipeline.backends.DaskBackend.start

    def start(self: pipeline.backends.DaskBackend) -> None:
        real_start(self)
        self.client.register_plugin(_Killer(target.split(".")[0]), name="kill-on")

    import dask

    with (
        monkeypatch.context() as mp,
        dask.config.set({"distributed.scheduler.allowed-failures": 0}),
    ):
        mp.setattr(pipeline.backends.DaskBackend, "start", start)
        with pytest.raises(Exception, match="KilledWorker|killed|worker"):
            _cluster_build("dask", reference, out, mp)
    assert not fmt.index_path(out).exists()
    before = shard_files(out)
    done = {Path(k).parts[1] for k in before}
    every = {e.file for e in fmt.read_index(ref).shards}
    assert (
        target not in done and done and done < every
    )  # (a task queued on a dying worker may fail too)
    ev = _cluster_build("dask", reference, out, monkeypatch)
    _same_bytes(ref, out)
    after = shard_files(out)
    assert all(after[k] == v for k, v in before.items()), "a finished shard was rewritten"
    resumed = [e for e in ev.events if e["event"] == "resumed"]
    assert resumed and resumed[0]["shards"] == len(done)
    assert sorted(e["file"] for e in ev.events if e["event"] == "shard") == sorted(every - done)


class _Killer(WorkerPlugin):  # type: ignore[misc]
    """A dask worker plugin: a worker starting a pack task whose key contains `match` exits at once
    (a lost worker); with a `marker` file only the first time, else at every attempt."""

    def __init__(self, match: str, marker: str | None = None) -> None:
        self.match, self.marker = match, marker

    def transition(self, key: object, start: str, finish: str, **kw: object) -> None:
        if (
            finish != "executing"
            or not str(key).startswith("pack-shards-")
            or self.match not in str(key)
        ):
            return
        if self.marker is not None:
            if os.path.exists(self.marker):
                return
            Path(self.marker).touch()
        os._exit(1)
