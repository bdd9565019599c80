"""Generations and leftovers (issue 13, "Generations" and case 6): a commit keeps the previous
generation's shards, content-named shards are never rewritten, `kill -9` leftovers (spill
folders, temp files, shards of an uncommitted build, an interrupted cleanup) are removed by the
next build, even an up-to-date one, or by `shardsmith gc`; files that are not ours are never
touched. Kills are real (SIGKILL in a subprocess)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.cli import main
from pipeline.gc import gc
from pipeline.generations import journals
from pipeline.verify import verify
from tests import hostile

# A build that kills itself (SIGKILL: no cleanup runs) at the N-th call of a function: argv =
# manifest, out, "module:function", N. Sources go through spill files, as big ones do.
KILLED_BUILD = """
import importlib, os, signal, sys
import pipeline.modalities.perturbation.pack as pack
import pipeline.parking as parking
pack.FUSE_BYTES, pack.SCATTER_BYTES, parking.PARK_BYTES = 0, 1, 0
manifest, out, target, after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
module, name = target.split(":")
mod = importlib.import_module(module)
original, calls = getattr(mod, name), [0]
def dying(*a, **k):
    calls[0] += 1
    if calls[0] > after:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*a, **k)
setattr(mod, name, dying)
from pipeline.build import build
build(manifest, out, jobs=1, progress=False)
"""


@pytest.fixture
def killed_build(checkout: Any) -> Callable[[Path, Path, str, int], None]:
    """``killed_build(manifest, out, "module:function", n)``: KILLED_BUILD, in its own process."""

    def run(manifest: Path, out: Path, target: str, after: int) -> None:
        res = checkout.python(KILLED_BUILD, str(manifest), str(out), target, str(after))
        assert res.returncode == -9, res.stderr

    return run


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@hostile.parametrize
def test_a_reader_of_generation_n_keeps_its_files_until_n_plus_2(
    case: hostile.Case, tmp_path: Path, small_manifest: Callable[..., Any]
) -> None:
    out = tmp_path / "out"
    first = build(small_manifest(tmp_path, seed=0), out, jobs=1, progress=False)
    gen1, gen1_sha = fmt.read_index(out), _sha(fmt.index_path(out))
    assert (
        first.index["generation"] == 1
        and first.index["previous"] is None
        and first.index["retired"] == []
    )
    build(small_manifest(tmp_path, seed=1), out, jobs=1, progress=False)
    gen2 = fmt.read_index(out)
    assert gen2.generation == 2 and gen2.previous is not None
    assert gen2.previous.index_sha256 == gen1_sha and gen2.previous.files() == gen1.files()
    # a loader that opened generation 1 still finds every file it names, with the bytes it recorded
    assert all(fmt.content_hash(gen1.shard_path(e)) == e.digest for e in gen1.shards)
    assert set(gen1.files()) - set(gen2.files()), (
        "seed 1 rewrote the shards: a real test of keeping"
    )
    build(small_manifest(tmp_path, seed=2), out, jobs=1, progress=False)
    gen3 = fmt.read_index(out)
    gone = set(gen1.files()) - set(gen2.files()) - set(gen3.files())
    assert gen3.generation == 3 and sorted(gone) == gen3.retired
    assert not any((out / f).exists() for f in gone)
    assert all((out / f).exists() for f in gen2.files() + gen3.files())
    assert verify(out) == []


@hostile.parametrize
def test_a_loader_survives_one_real_rebuild_and_is_told_after_two(
    case: hostile.Case, tmp_path: Path, small_manifest: Callable[..., Any]
) -> None:
    """Both halves together, with real builds: a loader that opened generation 1 finishes its epoch
    with generation 1's cells after generation 2 is committed mid-epoch (its shards are kept),
    and gets the "rebuilt; reopen" error once generation 3 has deleted them."""
    from loaders import ShardDataset, ShardLoader
    from loaders.format.integrity import DatasetRebuilt

    out = tmp_path / "out"
    build(small_manifest(tmp_path, seed=0), out, jobs=1, progress=False)
    kw = {
        "batch_size": 16,
        "window": 1,
        "shuffle": False,
        "decode_ahead": False,
        "decode_process": False,
    }
    want = np.concatenate([b["sample_id"].numpy() for b in ShardLoader(ShardDataset(out, **kw))])  # type: ignore[arg-type]
    dl = ShardLoader(ShardDataset(out, **kw))  # type: ignore[arg-type]
    it = iter(dl)
    first = next(it)["sample_id"].numpy()
    build(small_manifest(tmp_path, seed=1), out, jobs=1, progress=False)  # generation 2, mid-epoch
    got = np.concatenate([first, *(b["sample_id"].numpy() for b in it)])
    np.testing.assert_array_equal(got, want)
    it = iter(dl)  # a new epoch of the same loader: still generation 1
    next(it)
    build(
        small_manifest(tmp_path, seed=2), out, jobs=1, progress=False
    )  # generation 3 deletes generation 1's
    with pytest.raises(DatasetRebuilt, match="rebuilt since this loader opened it.*reopen"):
        for _ in it:
            pass


def test_a_rebuild_of_an_earlier_manifest_reuses_the_immutable_files(
    tmp_path: Path, shard_files: Callable[..., Any], small_manifest: Callable[..., Any]
) -> None:
    """Content-named shards: A -> B -> A names generation 1's files again, and they are not
    rewritten."""
    out = tmp_path / "out"
    a = build(small_manifest(tmp_path, seed=0), out, jobs=1, progress=False)
    before = shard_files(out)
    build(small_manifest(tmp_path, seed=1), out, jobs=1, progress=False)
    again = build(small_manifest(tmp_path, seed=0), out, jobs=1, progress=False)
    assert [s["file"] for s in again.index["shards"]] == [s["file"] for s in a.index["shards"]]
    assert [s["digest"] for s in again.index["shards"]] == [s["digest"] for s in a.index["shards"]]
    after = shard_files(out)
    assert all(after[k] == v for k, v in before.items()), "same inode and mtime: never rewritten"


def test_generations_fields_round_trip_and_old_indexes_read_as_generation_0(
    tmp_path: Path, small_manifest: Callable[..., Any]
) -> None:
    out = tmp_path / "out"
    build(small_manifest(tmp_path, seed=0), out, jobs=1, progress=False)
    build(small_manifest(tmp_path, seed=1), out, jobs=1, progress=False)
    index = fmt.read_index(out)
    assert fmt.read_index(out).to_json()["previous"] == index.previous.to_json()  # type: ignore[union-attr]
    doc = json.loads(fmt.index_path(out).read_text())
    for key in ("generation", "previous", "retired"):
        del doc[key]  # an index written before generations existed
    fmt.index_path(out).write_text(json.dumps(doc))
    old = fmt.read_index(out)
    assert (old.generation, old.previous, old.retired) == (0, None, [])
    build(
        small_manifest(tmp_path, seed=2), out, jobs=1, progress=False
    )  # upgrades: generation 1, keeps 0's
    new = fmt.read_index(out)
    assert new.generation == 1 and new.previous is not None and new.previous.files() == old.files()
    assert all((out / f).exists() for f in old.files())


@hostile.parametrize
def test_a_touch_keeps_the_older_generation_protected(
    case: hostile.Case, tmp_path: Path, small_manifest: Callable[..., Any]
) -> None:
    """A rebuild that changes no file (new mtime, same bytes) must not push generation N-1 out of
    reach: it commits no new generation at all (issue 45: the same bytes are no change), so
    generation 2 stays, keeping generation 1 protected."""
    out = tmp_path / "out"
    manifest = small_manifest(tmp_path, seed=0)
    build(manifest, out, jobs=1, progress=False)
    gen1 = fmt.read_index(out)
    build(small_manifest(tmp_path, seed=1), out, jobs=1, progress=False)
    (tmp_path / "src" / "s0.h5ad").touch()
    res = build(small_manifest(tmp_path, seed=1), out, jobs=1, progress=False)
    index = fmt.read_index(out)
    assert res.written == [] and not res.changed and index.generation == 2
    assert index.previous is not None and index.previous.files() == gen1.files()


@pytest.mark.process
@hostile.parametrize
def test_leftovers_of_a_killed_build_are_removed_by_the_next_build(
    case: hostile.Case,
    tmp_path: Path,
    killed_build: Callable[..., Any],
    listing: Callable[..., Any],
    small_manifest: Callable[..., Any],
) -> None:
    """Issue case 6: kill -9 during read/pack left OUT/.spill-<pid> and shards no index names, which
    later builds never removed. Now the next build, here an up-to-date one, removes exactly
    those."""
    out = tmp_path / "out"
    manifest = small_manifest(tmp_path, seed=0)
    build(manifest, out, jobs=1, progress=False)
    clean = listing(out)
    target, after = case.data
    killed_build(small_manifest(tmp_path, seed=1, name="other.toml"), out, target, after)
    left = listing(out) - clean
    assert any(f.startswith(".spill-") for f in left) and journals(out), left
    user = out / "shards" / "notes.txt"
    user.write_text("keep")
    res = build(manifest, out, jobs=1, progress=False)
    assert res.written == [], "the up-to-date shortcut was taken"
    assert listing(out) == clean | {"shards/notes.txt"} and user.read_text() == "keep"
    assert verify(out) == []


@pytest.mark.process
@hostile.parametrize
def test_a_kill_during_cleanup_is_finished_by_the_up_to_date_shortcut(
    case: hostile.Case,
    tmp_path: Path,
    killed_build: Callable[..., Any],
    small_manifest: Callable[..., Any],
) -> None:
    """Issue case 6: a kill while the commit deletes retired shards left them forever. The index
    lists what it retires before deleting, so the next build, even with nothing to rebuild,
    deletes the rest."""
    out = tmp_path / "out"
    for seed in (0, 1):
        build(small_manifest(tmp_path, seed=seed), out, jobs=1, progress=False)
    third = small_manifest(tmp_path, seed=2)
    killed_build(third, out, "pipeline.generations:remove", 1)
    index = fmt.read_index(out)
    assert index.generation == 3 and len(index.retired) > 2, "committed, then killed while deleting"
    stale = [f for f in index.retired if (out / f).exists()]
    assert stale and len(stale) == len(index.retired) - 1
    res = build(third, out, jobs=1, progress=False)
    assert res.written == [] and not any((out / f).exists() for f in index.retired)
    assert verify(out) == [] and not journals(out)


@pytest.mark.process
@hostile.parametrize
def test_a_killed_first_build_can_be_rebuilt_and_reuses_its_shards(
    case: hostile.Case,
    tmp_path: Path,
    killed_build: Callable[..., Any],
    small_manifest: Callable[..., Any],
) -> None:
    """A first build killed after some shards: the folder holds only our files (journaled), so it is
    not refused as foreign; the rebuild keeps the finished shards (same content-named files) and
    removes the rest."""
    out = tmp_path / "out"
    manifest = small_manifest(tmp_path, seed=0)
    killed_build(manifest, out, "pipeline.shardfile:write_columns", 3)
    assert not fmt.index_path(out).exists()
    written = {p.name: p.stat().st_ino for p in (out / "shards").iterdir()}
    assert written
    build(manifest, out, jobs=1, progress=False)
    kept = {p.name: p.stat().st_ino for p in (out / "shards").iterdir() if p.name in written}
    assert kept == written and not journals(out) and not list(out.glob(".spill-*"))
    assert verify(out) == []


@hostile.parametrize
def test_gc_removes_leftovers_and_only_ours(
    case: hostile.Case,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    listing: Callable[..., Any],
    small_manifest: Callable[..., Any],
) -> None:
    """`shardsmith gc DIR`: planted leftovers of every kind go; user files with look-alike names
    stay."""
    out = tmp_path / "out"
    build(small_manifest(tmp_path, seed=0), out, jobs=1, progress=False)
    build(small_manifest(tmp_path, seed=1), out, jobs=1, progress=False)
    index = fmt.read_index(out)
    clean = listing(out)
    name = index.shards[0].file
    planted = [
        ".spill-4242/plan-0-train-0-X.npy",
        ".index.json.k2j3h4_x.tmp",
        "..build-inputs.json.abc.tmp",
        f"shards/.tmp-{name}-4242",
        "shards/.tmp-val-002-000-00112233445566ff.zarr-77/zarr.json",
        ".tmp-conditions-00112233445566ff.zarr-77",
        ".build-4242.journal",
    ]
    orphan = "shards/train-000-009-0123456789abcdef.zarr"
    user = [
        "shards/notes.txt",
        ".spill-notes",
        "conditions-notes.md",
        ".index.json.bak",
        "shards/.tmp-mine",
    ]
    for rel in planted[:-1] + user + [orphan + "/zarr.json"]:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("x")
    (out / ".build-4242.journal").write_text(json.dumps({"pid": 4242, "files": [orphan]}))
    assert main(["gc", str(out)]) == 0
    assert "7 removed" in capsys.readouterr().out
    assert listing(out) == clean | set(user)
    assert verify(out) == [] and gc(out) == []
    # --drop-previous: the previous generation's files go too (its readers then get the "rebuilt"
    # error)
    assert index.previous is not None
    gone = set(index.previous.files()) - set(index.files())
    assert gone and sorted(gc(out, drop_previous=True)) == sorted(gone)
    assert verify(out) == []


@hostile.parametrize
def test_gc_refuses_a_folder_that_is_not_ours(
    case: hostile.Case,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    listing: Callable[..., Any],
) -> None:
    (tmp_path / "X" / "shards").mkdir(parents=True)
    (tmp_path / "X" / "shards" / "notes.txt").write_text("keep")
    assert main(["gc", str(tmp_path / "X")]) == 2
    assert "not a shardsmith dataset" in capsys.readouterr().err
    assert listing(tmp_path / "X") == {"shards", "shards/notes.txt"}
    assert main(["gc", str(tmp_path / "missing")]) == 2


LOKY_PARENT = """
import functools, time
from pipeline.backends import get_backend
backend = get_backend("loky", 2, None)
backend.start()
backend.map([functools.partial(time.sleep, 120)] * 4, "pack shards", False)
"""


@pytest.mark.process
@hostile.parametrize
def test_loky_workers_end_with_their_killed_build(case: hostile.Case, checkout: Any) -> None:
    """Issue case 6: loky workers of a build killed with kill -9 lived on for more than 5 minutes."""
    import signal
    import time

    import psutil

    parent = checkout.popen(LOKY_PARENT)
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not workers:  # workers that have started a task
            time.sleep(0.5)
            workers = [
                p
                for p in psutil.Process(parent.pid).children(recursive=True)
                if "popen_loky" in " ".join(p.cmdline()) and p.num_threads() > 1
            ]
        assert workers, "no loky worker started"
        time.sleep(1.5)  # let every worker pick a task (and start its watcher)
        workers = [
            p
            for p in psutil.Process(parent.pid).children(recursive=True)
            if "popen_loky" in " ".join(p.cmdline())
        ]
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, (
            f"orphaned loky workers still running 15 s after the build was killed: {alive}"
        )
    finally:
        if parent.poll() is None:
            parent.kill()
        for p in workers:  # nothing of ours left behind, whatever happened
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
