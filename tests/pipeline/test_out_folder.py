"""The output folder (issue 13, cases 1, 2 and 9): one writer per --out, only our own files are
deleted, index.json and shards get the umask's permissions. Concurrency is tested with real
processes. Failed writes: tests/pipeline/test_out_folder_failures.py."""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.cli import main
from pipeline.errors import EXIT_BAD_INPUT, EXIT_LOCKED, LockHeldError
from pipeline.lock import LOCK_FILE
from pipeline.verify import verify
from tests import hostile

HOLD = """
import sys, time
from pathlib import Path
from pipeline.lock import exclusive
with exclusive(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _holder(checkout: Any, out: Path, seconds: float):  # type: ignore[no-untyped-def]
    out.mkdir(parents=True, exist_ok=True)
    proc = checkout.popen(HOLD, str(out), str(seconds))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked", proc.stderr
    return proc


@pytest.mark.process
@hostile.parametrize
def test_second_writer_fails_at_once_naming_the_holder(
    case: hostile.Case,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    checkout: Any,
    small_manifest: Callable[..., Any],
) -> None:
    manifest = small_manifest(tmp_path)
    holder = _holder(checkout, tmp_path / "out", 60)
    try:
        t = time.monotonic()
        rc = main(
            ["build", str(manifest), "--out", str(tmp_path / "out"), "--jobs", "1", "--no-progress"]
        )
        err = capsys.readouterr().err
        assert rc == EXIT_LOCKED and time.monotonic() - t < 5
        assert f"pid {holder.pid}" in err and socket.gethostname() in err and "--wait" in err, err
        with pytest.raises(LockHeldError, match="waited 0.3 s"):
            build(manifest, tmp_path / "out", jobs=1, progress=False, wait=0.3)
        assert main(["gc", str(tmp_path / "out")]) == EXIT_LOCKED
        assert f"cannot gc {tmp_path / 'out'}: it is locked" in capsys.readouterr().err
        assert not fmt.index_path(tmp_path / "out").exists()
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the lock of the killed holder: no stale lock to remove by hand
    assert build(manifest, tmp_path / "out", jobs=1, progress=False).written
    assert (tmp_path / "out" / LOCK_FILE).read_text() == "", (
        "a finished holder leaves an empty lock file"
    )


@pytest.mark.process
@hostile.parametrize
def test_wait_takes_the_lock_when_the_holder_finishes(
    case: hostile.Case, tmp_path: Path, checkout: Any, small_manifest: Callable[..., Any]
) -> None:
    manifest = small_manifest(tmp_path)
    holder = _holder(checkout, tmp_path / "out", 1.0)
    try:
        res = build(manifest, tmp_path / "out", jobs=1, progress=False, wait=60)
    finally:
        holder.wait()
    assert holder.returncode == 0 and res.written and verify(tmp_path / "out") == []


@pytest.mark.process
@hostile.parametrize
def test_two_builds_with_different_manifests_never_mix(
    case: hostile.Case, tmp_path: Path, checkout: Any, small_manifest: Callable[..., Any]
) -> None:
    """Issue case 1: two real builds of different manifests into one --out, started together.
    Whoever wins, the committed index names only existing, intact shards; a loser exits 3 (or ran
    after the winner)."""
    a, b = (
        small_manifest(tmp_path, seed=0, name="a.toml"),
        small_manifest(tmp_path, seed=1, name="b.toml"),
    )
    out = tmp_path / "out"
    procs = [
        checkout.cli("build", str(m), "--out", str(out), "--jobs", "1", "--no-progress")
        for m in (a, b)
    ]
    codes = [p.wait(timeout=300) for p in procs]
    errors = [p.stderr.read() for p in procs if p.stderr is not None]
    assert sorted(codes) in ([0, 0], [0, EXIT_LOCKED]), errors
    for code, err in zip(codes, errors, strict=True):
        if code == EXIT_LOCKED:
            assert "it is locked by another shardsmith process" in err and "pid " in err, err
    assert verify(out) == []
    index = fmt.read_index(out)
    assert all((out / f).exists() for f in index.files())


@hostile.parametrize
def test_a_folder_that_is_not_ours_is_refused_untouched(
    case: hostile.Case,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    small_manifest: Callable[..., Any],
) -> None:
    """Issue case 2: a build into a folder holding anything but a dataset (or our leftovers) is
    refused with exit 2 and a message naming the folder and what it holds; not one file is added,
    changed or removed."""
    manifest, layout = small_manifest(tmp_path), dict(case.data)
    out = tmp_path / "X"
    for rel, text in layout.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    paths = sorted(out.rglob("*"))
    rc = main(["build", str(manifest), "--out", str(out), "--jobs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT and f"--out {out} is not a shardsmith dataset" in err, err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(out.rglob("*")) == paths, "nothing created (no lock file, no shards/)"


@hostile.parametrize
def test_user_files_in_a_dataset_survive_rebuilds(
    case: hostile.Case, tmp_path: Path, small_manifest: Callable[..., Any]
) -> None:
    """Only files a committed index or a build's journal named are deleted: a user's note inside
    shards/ survives rebuilds that retire every shard around it."""
    (tmp_path / "out").mkdir()
    build(small_manifest(tmp_path, seed=0), tmp_path / "out", jobs=1, progress=False)
    notes = [
        tmp_path / "out/shards/notes.txt",
        tmp_path / "out/conditions-notes.md",
        tmp_path / "out/README",
    ]
    for p in notes:
        p.write_text("keep")
    for seed in (1, 2, 3):  # generation 4 retires generation 2's shards, 3 retires 1's
        res = build(small_manifest(tmp_path, seed=seed), tmp_path / "out", jobs=1, progress=False)
        assert res.written
    assert all(p.read_text() == "keep" for p in notes)
    assert verify(tmp_path / "out") == []


@hostile.parametrize
def test_index_and_shards_get_the_umask_permissions(
    case: hostile.Case, tmp_path: Path, small_manifest: Callable[..., Any]
) -> None:
    """Issue case 9: index.json was 0600 (mkstemp) while shards were 0644."""
    umask = int(case.data)
    old = os.umask(umask)
    try:
        build(small_manifest(tmp_path), tmp_path / "out", jobs=1, progress=False)
    finally:
        os.umask(old)
    out = tmp_path / "out"
    expected = 0o666 & ~umask
    shard_file = next(p for p in (out / "shards").rglob("*") if p.is_file())
    for p in (out / "index.json", out / ".build-inputs.json", shard_file, out / LOCK_FILE):
        assert stat.S_IMODE(p.stat().st_mode) == expected, (p, oct(p.stat().st_mode))


def test_a_waiter_never_locks_a_lock_file_its_holder_removed(tmp_path: Path) -> None:
    """A failed first build unlinks its lock file (and its folder) while holding it; a build that
    was waiting on that file must lock a new one at the path, or two writers could each hold
    'the' lock."""
    import threading

    from pipeline.lock import exclusive

    out = tmp_path / "out"
    out.mkdir()
    held = threading.Event()
    seen: list[object] = []

    def waiter() -> None:
        try:
            with exclusive(out, wait=10):
                ino = os.stat(out / LOCK_FILE).st_ino
                try:  # the lock at the path is really held (by us): a third writer is refused
                    with exclusive(out):
                        seen.append("third writer got in")
                except LockHeldError:
                    seen.append(ino)
        except Exception as e:  # noqa: BLE001  (reported by the assertion below)
            seen.append(e)

    with exclusive(out):
        t = threading.Thread(target=waiter)
        t.start()
        held.wait(0.5)  # the waiter has opened the same file and polls it
        (out / LOCK_FILE).unlink()
        out.rmdir()
    t.join(15)
    assert len(seen) == 1 and isinstance(seen[0], int), seen
