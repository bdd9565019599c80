"""Issue 13, read side: damaged shards, loaders opened before a rebuild, stopped processes, resume
states.

Every test here runs the hostile cases of ``tests/hostile/read.py`` (one row each in
docs/RELIABILITY.md) on real builds (zarr and tar) of one small manifest (``built_zarr_tar``,
tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tarfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from loaders import ShardDataset, ShardLoader
from loaders import format as fmt
from loaders.format.integrity import DatasetRebuilt
from loaders.format.readers import read_shard
from loaders.loader import LoaderTimeout
from pipeline.writers import Codec, get_writer
from tests import hostile


@pytest.fixture(scope="module")
def built(built_zarr_tar: dict[str, Path]) -> dict[str, Path]:
    """format -> one small manifest built in that format (zarr, tar)."""
    return built_zarr_tar


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _train(index: fmt.Index) -> list[fmt.ShardEntry]:
    return index.shards_of("train")


def _zarr_chunk(array_dir: Path) -> Path:
    return sorted(p for p in (array_dir / "c").rglob("*") if p.is_file())[0]


def _tar_member(path: Path, key: str) -> str:
    with tarfile.open(path) as tf:
        meta = json.loads(tf.extractfile("_meta.json").read())  # type: ignore[union-attr]
    field = {k: f for f, k in meta["columns"].items()}[key]
    return f"tables.{field}.npy" if key in meta["tables"] else f"b000000.{field}.npy"


def _tar_without(path: Path, member: str) -> None:
    with tarfile.open(path) as tf:
        kept = [(info, tf.extractfile(info).read()) for info in tf if info.name != member]  # type: ignore[union-attr]
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as out:
        for info, data in kept:
            out.addfile(info, __import__("io").BytesIO(data))


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _rewrite(
    root: Path, entry: fmt.ShardEntry, edit: dict[str, object], drop_bound: str | None = None
) -> Path:
    """Rewrite a shard with ``edit`` applied (column -> (row, value)) and commit an index that
    matches it."""
    index = fmt.read_index(root)
    path = index.shard_path(entry)
    cols = read_shard(path, index.encoding, fmt.shard_keys(index.fields, index.tables))
    cols = {k: np.array(v) for k, v in cols.items()}
    for key, (row, value) in edit.items():  # type: ignore[misc]
        cols[key][row] = value
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    get_writer(
        index.encoding, Codec(index.codec.get("name", "none"), index.codec.get("level", 0))
    ).write(path, cols, index.tables)
    raw = json.loads(fmt.index_path(root).read_text())
    for e in raw["shards"]:
        if e["file"] == entry.file:
            e["digest"], e["bytes"] = fmt.content_hash(path), fmt.stored_bytes(path)
    for f in raw["fields"]:
        if f["name"] == drop_bound:
            f.pop("bound", None)
    raw["digest"] = fmt.index_digest(raw)  # as a build seals it: the read-side checks are tested
    fmt.index_path(root).write_text(json.dumps(raw))
    return path


def damage(root: Path, encoding: str, how: str, target: str) -> Path:
    """Apply one damage to the first train shard (or the condition table); returns the damaged file."""
    index = fmt.read_index(root)
    if target.startswith("conditions:"):
        assert index.conditions is not None
        path, key = root / index.conditions.file, target.split(":", 1)[1]
    else:
        path, key = index.shard_path(_train(index)[0]), target
    if how == "code":
        return _rewrite(root, _train(index)[0], {key: (0, 239)}, drop_bound=key)
    if encoding == "zarr":
        chunk = _zarr_chunk(path / key)
        if how == "delete":
            chunk.unlink()
        else:
            _flip(chunk, chunk.stat().st_size // 2)
        return path
    member = _tar_member(path, key)
    if how == "delete":
        _tar_without(path, member)
    else:
        with tarfile.open(path) as tf:
            info = tf.getmember(member)
        _flip(path, info.offset_data + info.size - 3)  # inside the payload, past the .npy header
    return path


def _drain(dl: ShardLoader) -> list[np.ndarray]:
    return [b["sample_id"].numpy() for b in dl]


@hostile.parametrize
def test_damaged_shard(case: hostile.Case, built: dict[str, Path], tmp_path: Path) -> None:
    encoding, how, target, sample, *rest = case.data
    verify = rest[0] if rest else True
    root = _copy(built[encoding], tmp_path / "ds")
    bad = damage(root, encoding, how, target)
    modes = ("raise", "skip") if target.startswith("conditions:") else ("raise",)
    for on_corrupt in modes:
        ds = ShardDataset(
            root,
            sample=sample,
            batch_size=64,
            window=2,
            decode_process=False,
            verify=verify,
            on_corrupt=on_corrupt,
        )
        with pytest.raises(fmt.FormatError, match=re.escape(str(bad))) as err:
            _drain(ShardLoader(ds))
        assert not isinstance(err.value, DatasetRebuilt)
        if how == "code":
            assert "outside [0, 10)" in str(err.value)


@pytest.mark.process
@hostile.parametrize
def test_damaged_shard_is_skipped_and_counted(
    case: hostile.Case, built: dict[str, Path], tmp_path: Path, started: Callable[..., Any]
) -> None:
    encoding, how, target, sample = case.data
    root = _copy(built[encoding], tmp_path / "ds")
    index = fmt.read_index(root)
    good = [e for e in _train(index)[1:]]
    want = np.concatenate(
        [
            c[fmt.SAMPLE_ID][c[fmt.PRIMARY]]
            for c in (
                read_shard(index.shard_path(e), encoding, [fmt.SAMPLE_ID, fmt.PRIMARY])
                for e in good
            )
        ]
    )
    bad = damage(root, encoding, how, target)
    # zarr: through the decoder process (the skip crosses the pipe); tar: in DataLoader workers
    # (shared counts)
    workers = 2 if encoding == "tar" else 0
    ds = ShardDataset(
        root, batch_size=50, window=2, seed=1, on_corrupt="skip", decode_process=workers == 0
    )
    dl = ShardLoader(ds, num_workers=workers, timeout=60)
    if workers == 0:
        started(ds)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids = _drain(dl)
    assert len(ids) == len(
        dl
    )  # same batch count on every rank: the skipped units only shrink batches
    got = np.concatenate(ids)
    np.testing.assert_array_equal(np.sort(got), np.sort(want))
    assert ds.skipped_shards == [bad.name]
    if (
        workers == 0
    ):  # the warning is raised where the arena arrives (workers warn in their own process)
        assert any(
            bad.name in str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)
        )


@hostile.parametrize
def test_shard_changed_after_it_was_checked(
    case: hostile.Case, built: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(built[case.data], tmp_path / "ds")
    dl = ShardLoader(
        ShardDataset(root, batch_size=64, window=1, decode_process=False, decode_ahead=False)
    )
    _drain(dl)  # every train shard hashed once (and remembered)
    path = fmt.read_index(root).shard_path(_train(fmt.read_index(root))[0])
    target = _zarr_chunk(path / "X" / "data") if case.data == "zarr" else path
    st = target.stat()
    _flip(target, st.st_size - 3)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    dl.set_epoch(1)
    with pytest.raises(fmt.FormatError, match=re.escape(str(path)) + ".*content hash mismatch"):
        _drain(dl)


def _rebuild_index(root: Path, rename: bool) -> None:
    """Commit a new index.json (another generation): train shards renamed to new files when
    ``rename``."""
    raw = json.loads(fmt.index_path(root).read_text())
    raw["name"] += "-rebuilt"
    if rename:
        for e in raw["shards"]:
            new = "gen2-" + e["file"]
            shutil.copytree(root / "shards" / e["file"], root / "shards" / new) if (
                root / "shards" / e["file"]
            ).is_dir() else shutil.copy(root / "shards" / e["file"], root / "shards" / new)
            e["file"] = new
    raw["digest"] = fmt.index_digest(raw)  # a rebuild's index is sealed
    fmt.index_path(root).write_text(json.dumps(raw))


@pytest.mark.process
@hostile.parametrize
def test_loader_opened_before_a_rebuild(
    case: hostile.Case, built: dict[str, Path], tmp_path: Path, started: Callable[..., Any]
) -> None:
    mode, workers = case.data
    root = _copy(built["zarr"], tmp_path / "ds")
    index = fmt.read_index(root)
    kw = {"batch_size": 16, "window": 1, "shuffle": False, "decode_ahead": False}
    want = np.concatenate(_drain(ShardLoader(ShardDataset(root, decode_process=False, **kw))))  # type: ignore[arg-type]
    if (
        mode == "decoder"
    ):  # the decoder process starts after index.json changed: train shards swapped in it
        ds = ShardDataset(root, decode_process=True, **kw)  # type: ignore[arg-type]
        raw = json.loads(fmt.index_path(root).read_text())
        raw["shards"] = raw["shards"][::-1]
        raw["digest"] = fmt.index_digest(raw)  # a rebuild's index is sealed
        fmt.index_path(root).write_text(json.dumps(raw))
        got = np.concatenate(_drain(ShardLoader(started(ds))))
        np.testing.assert_array_equal(got, want)
        return
    ds = ShardDataset(root, decode_process=False, **kw)  # type: ignore[arg-type]
    # workers ahead by one batch only, so that the files are still to be read when they change
    dl = ShardLoader(ds, num_workers=workers, timeout=60, worker_batches=1, prefetch_factor=1)
    it = iter(dl)
    first = next(it)["sample_id"].numpy()
    if mode == "kept":
        _rebuild_index(root, rename=True)
        got = np.concatenate([first, *(b["sample_id"].numpy() for b in it)])
        np.testing.assert_array_equal(got, want)
        return
    if mode == "gone":
        _rebuild_index(root, rename=True)
        for e in index.shards:
            shutil.rmtree(index.shard_path(e))
    # rewritten in place: the second train shard (a later window) gets other content, same name
    else:
        second = _train(index)[1]
        _rewrite(root, second, {fmt.SAMPLE_ID: (0, 10**9)})
    with pytest.raises(DatasetRebuilt, match="rebuilt since this loader opened it") as err:
        for _ in it:
            pass
    assert "reopen" in str(err.value)


def _children(exclude: str = "loaders.engine.decoder") -> list[psutil.Process]:
    return [p for p in psutil.Process().children() if exclude not in " ".join(p.cmdline())]


@pytest.mark.process
@hostile.parametrize
def test_stopped_decoder_process(
    case: hostile.Case, built: dict[str, Path], started: Callable[..., Any]
) -> None:
    kw = {"batch_size": 16, "window": 1, "shuffle": False, "decode_ahead": False}
    want = _drain(ShardLoader(ShardDataset(built["zarr"], decode_process=False, **kw)))  # type: ignore[arg-type]
    ds = ShardDataset(built["zarr"], decode_process=True, **kw)  # type: ignore[arg-type]
    dl = ShardLoader(ds, timeout=case.data)  # the loader's timeout covers the decoder process too
    dec = started(ds).engine_here().decoder()
    assert dec is not None and dec.timeout == case.data
    os.kill(dec.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match="no reply or heartbeat for 2 s"):
            got = _drain(dl)
        assert time.monotonic() - t0 < 4 * case.data + 5
        assert not ds.decode_process and dec.proc.wait(timeout=5) is not None
        assert len(got) == len(want) and all(
            np.array_equal(a, b) for a, b in zip(got, want, strict=True)
        )
    finally:
        if dec.proc.poll() is None:
            dec.proc.kill()


@pytest.mark.process
@hostile.parametrize
def test_stopped_dataloader_worker(case: hostile.Case, built: dict[str, Path]) -> None:
    ds = ShardDataset(built["zarr"], batch_size=8, window=1, decode_process=False)
    dl = ShardLoader(ds, num_workers=2, timeout=case.data)
    before = {
        p.pid for p in _children()
    }  # earlier tests' processes still alive are not this loader's workers
    it = iter(dl)
    next(it)
    workers = [p for p in _children() if p.pid not in before]
    assert len(workers) == 2
    os.kill(workers[1].pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(LoaderTimeout, match=rf"{workers[1].pid} \(T\).*timeout=2 s"):
            for _ in it:
                pass
        assert time.monotonic() - t0 < 4 * case.data + 10
        for w in workers:
            assert not w.is_running() or w.status() == psutil.STATUS_ZOMBIE
    finally:
        for w in workers:
            if w.is_running():
                w.kill()


@hostile.parametrize
def test_resume_state_is_refused(case: hostile.Case, built: dict[str, Path]) -> None:
    key, value = case.data
    dl = ShardLoader(ShardDataset(built["zarr"], batch_size=32, decode_process=False))
    if key == "dataset":  # the tar build of the same manifest: same units, other bytes
        other = ShardLoader(ShardDataset(built["tar"], batch_size=32, decode_process=False))
        state = other.state_dict()
        assert (
            state["units"] == dl.state_dict()["units"]
            and state["dataset"] != dl.state_dict()["dataset"]
        )
    else:
        state = dl.state_dict()
        if value is KeyError:
            del state[key]
        else:
            state[key] = value
    with pytest.raises(ValueError, match=f"'{key}'"):
        dl.load_state_dict(state)
    dl.load_state_dict(
        json.loads(json.dumps(dl.state_dict()))
    )  # its own state, through JSON, loads
