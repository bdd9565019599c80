"""Issue 25, read side: an edited index.json refused at open (items 6-7), no unbounded wait (item
10: the loader's default bound on workers, a glob over the filesystem root refused, a long glob's
progress), and a sample type the dataset does not serve (item 15). The cases are the rows of
``tests/hostile/misuse_read.py``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from loaders import ShardDataset, ShardLoader
from loaders import format as fmt
from loaders.loader import DEFAULT_TIMEOUT_S, LoaderTimeout
from loaders.samples import SAMPLE_TYPES
from pipeline import source_files
from pipeline.build import build
from pipeline.errors import ManifestError
from pipeline.manifest import load_manifest
from pipeline.modalities.spike.demo import write_spike_demo
from pipeline.verify import verify
from tests import hostile

MANIFESTS = Path(__file__).resolve().parents[2] / "data_manifests"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]) -> Path:
    """A small perturbation dataset: 2 sources x 200 cells, train/val/test, 2 train shards."""
    root = tmp_path_factory.mktemp("issue25-read")
    return build_dataset(root, sources=2, cells=200, genes=50, perts=4).out


@pytest.fixture(scope="module")
def spike(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The spike demo, built (a dataset of another kind than ``built``)."""
    root = tmp_path_factory.mktemp("issue25-spike")
    write_spike_demo(root / "data" / "demo")
    (root / "m").mkdir()
    shutil.copy(MANIFESTS / "demo_spike.toml", root / "m" / "demo_spike.toml")
    build(root / "m" / "demo_spike.toml", root / "out", jobs=1, progress=False)
    return root / "out"


# -- items 6, 7: the index's own content, checked at open --------------------------------------
def _edit(raw: dict[str, Any], edit: str) -> None:
    """Apply one edit of a case to index.json's document (its stored digest left as built)."""
    train = [n for n, e in enumerate(raw["shards"]) if e["split"] == "train"]
    if edit.startswith("older-digest-"):  # as an earlier shardsmith sealed it: its first keys
        raw["digest"] = {k: raw["digest"][k] for k in fmt.FIRST_DIGEST_KEYS}
        raw["version"] = 4  # the version such a shardsmith wrote (5 on: every key is required)
        edit = edit.removeprefix("older-digest-")
    if edit.startswith("version-3-"):  # an index as a shardsmith before version 4 wrote it
        raw["version"] = 3
        edit = edit.removeprefix("version-3-")
    if edit == "shard-removed":
        del raw["shards"][train[-1]]
    elif edit == "labels-swapped":
        labels = raw["vocabularies"]["perturbation"]
        labels[1], labels[2] = labels[2], labels[1]
    elif edit == "units-edited":
        raw["shards"][train[0]]["units"]["cells"] += 1
    elif edit == "digest-removed":
        del raw["digest"]
    else:
        raise AssertionError(edit)


@hostile.parametrize
def test_an_edited_index_is_refused_at_open(
    case: hostile.Case, built: Path, tmp_path: Path
) -> None:
    edit, outcome = case.data
    root = tmp_path / "ds"
    shutil.copytree(built, root)
    assert ShardDataset(root, decode_process=False) is not None  # as built: opens
    raw = json.loads(fmt.index_path(root).read_text())
    _edit(raw, edit)
    fmt.index_path(root).write_text(json.dumps(raw))
    problems = verify(root, check_hashes=False)
    if outcome == "warn":
        with pytest.warns(RuntimeWarning, match=r"index\.json: no content digest.*rebuild"):
            ds = ShardDataset(root, decode_process=False)
        assert next(iter(ShardLoader(ds))) is not None
        assert any("no content digest" in p for p in problems), problems
    elif outcome == "refused":  # a current index stripped of its digest: the way to edit it
        with pytest.raises(fmt.FormatError, match=r"index\.json: index version 5 without its "):
            ShardDataset(root, decode_process=False)
        assert any("no content digest" in p for p in problems), problems
    elif outcome == "verify":
        ds = ShardDataset(root, decode_process=False)
        assert any("primary records, the plan placed" in p for p in problems), problems
    else:
        with pytest.raises(fmt.FormatError) as err:
            ShardDataset(root, decode_process=False)
        msg = str(err.value)
        assert str(fmt.index_path(root)) in msg and f"'{outcome}' differ" in msg, msg
        assert "rebuild the dataset" in msg and f"shardsmith verify {root}" in msg, msg
        # verify names the same key: one check, two callers
        assert any(f"'{outcome}' differs from the digest" in p for p in problems), problems


# -- item 10: no wait on a worker is unbounded by default ----------------------------------------
@hostile.parametrize
def test_the_default_wait_on_a_worker_is_bounded(case: hostile.Case, built: Path) -> None:
    kw: dict[str, Any] = {"batch_size": 8, "window": 1, "decode_process": False}
    ds = ShardDataset(built, **kw)
    dl = ShardLoader(ds, num_workers=2)
    assert DEFAULT_TIMEOUT_S == 300 and dl.timeout == DEFAULT_TIMEOUT_S
    assert dl._loader.timeout == DEFAULT_TIMEOUT_S  # what torch waits for a worker's message
    assert ds.decode_timeout == 30  # the decoder keeps its own, shorter bound
    for off in (None, 0):  # off only when asked
        quiet = ShardLoader(ShardDataset(built, **kw), num_workers=2, timeout=off)
        assert quiet.timeout == 0 and quiet._loader.timeout == 0
    short = ShardDataset(built, **kw)
    ShardLoader(short, timeout=2)
    assert short.decode_timeout == 2  # a shorter loader bound covers the decoder too
    with pytest.raises(ValueError, match="timeout=-1"):
        ShardLoader(ShardDataset(built, **kw), timeout=-1)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


@pytest.mark.process
@hostile.parametrize
def test_a_stopped_worker_is_named_within_the_bound(case: hostile.Case, built: Path) -> None:
    ds = ShardDataset(built, batch_size=8, window=1, decode_process=False)
    dl = ShardLoader(ds, num_workers=2, timeout=case.data)
    before = _children()  # earlier tests' processes still alive are not this loader's workers
    it = iter(dl)
    next(it)
    workers = [psutil.Process(pid) for pid in _children() - before]
    assert len(workers) == 2
    os.kill(workers[1].pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(LoaderTimeout) as err:
            for _ in it:
                pass
        msg = str(err.value)
        assert re.search(rf"{workers[1].pid} \(T\).*timeout=2 s", msg), msg
        assert "timeout=None removes it" in msg, msg
        assert time.monotonic() - t0 < 4 * case.data + 10
    finally:
        for w in workers:
            if w.is_running():
                w.kill()


# -- item 10: a glob over the whole filesystem, and a long one ----------------------------------
def _manifest(
    tmp_path: Path, write_manifest: Callable[..., Any], pattern: str, allow: bool = False
) -> Path:
    path = write_manifest(tmp_path / "m.toml", pattern=pattern)
    if allow:
        text = path.read_text().replace('type = "h5ad"', 'type = "h5ad"\nallow_root_glob = true')
        path.write_text(text)
    return path


@hostile.parametrize
def test_a_glob_over_the_filesystem_root_is_refused(
    case: hostile.Case, tmp_path: Path, write_manifest: Callable[..., Any]
) -> None:
    pattern, allow = case.data
    path = _manifest(tmp_path, write_manifest, pattern, allow)
    t0 = time.monotonic()
    with pytest.raises(ManifestError) as err:
        load_manifest(path)
    assert time.monotonic() - t0 < 5  # refused before any walk
    assert err.value.key == "sources[0].path", err.value
    if allow:
        assert "no file matches" in err.value.problem, err.value
    else:
        assert "whole filesystem" in err.value.problem, err.value
        assert "allow_root_glob = true" in err.value.problem, err.value


@hostile.parametrize
def test_a_long_glob_reports_progress_and_its_count(
    case: hostile.Case,
    tmp_path: Path,
    write_manifest: Callable[..., Any],
    build_dataset: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    build_dataset(tmp_path, "sources", sources=3, cells=20, genes=10, perts=2)
    path = _manifest(tmp_path, write_manifest, "src/*.h5ad")
    iglob = source_files.glob.iglob

    def slow(pattern: str, **kw: Any) -> Iterator[str]:  # a walk over a large tree
        for match in iglob(pattern, **kw):
            time.sleep(0.2)
            yield match

    monkeypatch.setattr(source_files, "GLOB_PROGRESS_S", 0.05)
    monkeypatch.setattr(source_files.glob, "iglob", slow)
    with caplog.at_level(logging.INFO, logger="pipeline.source_files"):
        m = load_manifest(path)
    assert len(m.sources) == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.source_files"]
    assert any(re.search(r"still matching, [0-3] file\(s\) so far after \d+ s", x) for x in lines)
    assert any("sources[0].path 'src/*.h5ad': 3 file(s) matched in" in x for x in lines), lines


# -- item 15: a sample type the dataset does not serve -------------------------------------------
@hostile.parametrize
def test_a_sample_type_the_dataset_does_not_serve(
    case: hostile.Case, built: Path, spike: Path, tmp_path: Path
) -> None:
    kind, names = case.data
    root = spike if kind == "spike" else built
    if kind == "perturbation-no-samples":  # an index listing none (hand-written, older)
        root = tmp_path / "ds"
        shutil.copytree(built, root)
        raw = json.loads(fmt.index_path(root).read_text())
        raw["samples"] = []
        fmt.index_path(root).write_text(json.dumps(raw))
    index = fmt.read_index(root)
    names = names or [n for n in SAMPLE_TYPES.names() if n not in index.samples]
    assert names
    for name in names:
        with pytest.raises(ValueError) as err:
            ShardDataset(root, sample=name, decode_process=False)
        msg = str(err.value)
        assert f"sample={name!r}" in msg and f"is a {index.kind!r} dataset" in msg, msg
        if index.samples:
            assert f"serves the sample types {index.samples}" in msg, msg
        else:
            assert "lists no sample types" in msg and "needs 'spikes'" in msg, msg
