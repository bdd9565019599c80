"""The output folder when writes fail (issue 13, the full-disk bullet and case 9): a failed write
keeps the previous dataset intact, a failed first build leaves the folder as it found it, a real
full or read-only file system is a clear error, and an unreadable source is not blamed on --out."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.cli import main
from pipeline.errors import EXIT_BAD_INPUT, EXIT_CRASH, OutputError
from pipeline.verify import verify
from tests import hostile


def _fail_on(monkeypatch: pytest.MonkeyPatch, stage: str, err: int) -> None:
    """Make one write of the next build fail with ``err`` (a full disk, a read-only mount)."""
    import pipeline.shardfile
    from pipeline.writers.zarr_writer import ZarrShardWriter

    def raise_it(path: object) -> None:
        raise OSError(err, os.strerror(err), str(path))

    if stage == "shard":
        calls = [0]
        original = ZarrShardWriter.write

        def write(self: ZarrShardWriter, path: Path, *a: object, **k: object) -> None:
            calls[0] += 1
            if calls[0] > 2:  # after the condition table and one shard were written
                raise_it(path)
            original(self, path, *a, **k)  # type: ignore[arg-type]

        monkeypatch.setattr(ZarrShardWriter, "write", write)
    elif stage == "index":
        original_atomic = fmt.atomic_write_bytes

        def atomic(path: str | Path, data: bytes) -> None:
            if Path(path).name == fmt.INDEX_FILE:
                raise_it(path)
            original_atomic(path, data)

        monkeypatch.setattr(fmt, "atomic_write_bytes", atomic)
    elif stage == "durable":
        monkeypatch.setattr(pipeline.shardfile, "make_durable", lambda *a: raise_it("syncfs"))
        monkeypatch.setattr("pipeline.commit.make_durable", lambda *a: raise_it("syncfs"))


@hostile.parametrize
def test_a_failed_write_keeps_the_previous_dataset(
    case: hostile.Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    listing: Callable[..., Any],
    shard_files: Callable[..., Any],
    small_manifest: Callable[..., Any],
) -> None:
    """A full disk or read-only --out ends with a clear error naming --out and the errno; the
    previous dataset stays committed and intact, and the failed build's own files are removed
    (space given back)."""
    stage, err, code = case.data
    assert code in (EXIT_CRASH, EXIT_BAD_INPUT)
    out = tmp_path / "out"
    build(small_manifest(tmp_path, seed=0), out, jobs=1, progress=False)
    index_bytes, shards, files = fmt.index_path(out).read_bytes(), shard_files(out), listing(out)
    _fail_on(monkeypatch, stage, err)
    rc = main(
        [
            "build",
            str(small_manifest(tmp_path, seed=1)),
            "--out",
            str(out),
            "--jobs",
            "1",
            "--no-progress",
        ]
    )
    msg = capsys.readouterr().err
    assert rc == code, msg
    assert (
        f"cannot write to --out {out}" in msg and errno.errorcode[err] in msg and "intact" in msg
    ), msg
    assert fmt.index_path(out).read_bytes() == index_bytes and shard_files(out) == shards
    assert listing(out) == files, "the failed build's shards, journal and spill are gone"
    monkeypatch.undo()
    assert verify(out) == []
    assert build(
        small_manifest(tmp_path, seed=1), out, jobs=1, progress=False
    ).written  # and it recovers


def test_an_unreadable_source_is_not_blamed_on_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_manifest: Callable[..., Any]
) -> None:
    """EACCES on a file outside --out is not an OutputError: the message must point at the right
    place."""
    from pipeline.generations import _fails_the_output

    out = tmp_path / "out"
    assert _fails_the_output(out, OSError(errno.EACCES, "denied", str(out / "shards" / "x")))
    assert not _fails_the_output(
        out, OSError(errno.EACCES, "denied", str(tmp_path / "src" / "s0.h5ad"))
    )
    assert _fails_the_output(out, OSError(errno.ENOSPC, "full"))
    with pytest.raises(OutputError, match="is not a folder"):
        (tmp_path / "file").write_text("x")
        build(small_manifest(tmp_path), tmp_path / "file", jobs=1, progress=False)


TMPFS_SCRIPT = """
import json, subprocess, sys
from pathlib import Path
from loaders import format as fmt
from pipeline.build import build
from pipeline.cli import main
from pipeline.verify import verify
root, out = Path(sys.argv[1]), Path(sys.argv[2])
texts = [Path(p).read_text() for p in sys.argv[3:]]  # small_manifest(root, seed=k)'s, k = 0, 1, 2


def small_manifest(root, seed):  # what the fixture writes: root/m.toml, dataset seed `seed`
    (root / "m.toml").write_text(texts[seed])
    return root / "m.toml"


# the listing fixture's function: its source replaces the next line
#LISTING
build(small_manifest(root, seed=0), out, jobs=1, progress=False)
st = __import__("os").statvfs(out)
used_kib = (st.f_blocks - st.f_bfree) * st.f_frsize // 1024
# room for half a generation more: the next one cannot fit beside the kept one
subprocess.run(["mount", "-o", f"remount,size={used_kib * 3 // 2}k", str(out)], check=True)
index, files = fmt.index_path(out).read_bytes(), listing(out)
full = main(["build", str(small_manifest(root, seed=1)), "--out", str(out), "--jobs", "1", "-q"])
same = fmt.index_path(out).read_bytes() == index and listing(out) == files and verify(out) == []
subprocess.run(["mount", "-o", "remount,ro", str(out)], check=True)
ro = main(["build", str(small_manifest(root, seed=2)), "--out", str(out), "--jobs", "1", "-q"])
print(json.dumps({"full": full, "same": same, "ro": ro, "intact": verify(out) == []}))
"""


@pytest.mark.process
@hostile.parametrize
def test_a_real_full_and_read_only_file_system(
    case: hostile.Case,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    checkout: Any,
    listing: Callable[..., Any],
    small_manifest: Callable[..., Any],
) -> None:
    """The same guarantees on a real tmpfs (in a private mount namespace: `unshare -rm`, so nothing
    is left mounted), where the platform allows it: shrunk after the first build to 1.5 times
    what it uses, so the second generation does not fit beside the first."""
    import inspect
    import json
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    small_manifest(tmp_path)
    texts = [str(small_manifest(tmp_path, seed=k, name=f"seed{k}.toml")) for k in range(3)]
    script = TMPFS_SCRIPT.replace("#LISTING\n", inspect.getsource(listing))
    (tmp_path / "out").mkdir()
    shell = 'mount -t tmpfs -o size=64m tmpfs "$1" 2>/dev/null || exit 77; shift; exec "$@"'
    res = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            shell,
            "sh",
            str(tmp_path / "out"),
            sys.executable,
            "-c",
            script,
            str(tmp_path),
            str(tmp_path / "out"),
            *texts,
        ],
        capture_output=True,
        text=True,
        env=checkout.env,
        cwd=checkout.root,
        timeout=300,
    )
    if res.returncode == 77 or "unshare" in res.stderr.split(":")[0]:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()[:200]}")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"full": EXIT_CRASH, "same": True, "ro": EXIT_BAD_INPUT, "intact": True}, (
        res.stderr
    )
    assert (
        "ENOSPC" in res.stderr and "EROFS" in res.stderr and "cannot write to --out" in res.stderr
    )


@pytest.mark.parametrize("existed", [False, True], ids=["new-folder", "empty-folder"])
def test_a_failed_first_build_leaves_out_as_it_found_it(
    tmp_path: Path, existed: bool, small_manifest: Callable[..., Any]
) -> None:
    """Bad input found after the lock is taken (a missing obs column): no lock file, no empty
    ``shards/``, no folder the build made (issue 14: nothing left in --out by a build that failed
    before its first commit)."""
    m = small_manifest(tmp_path)
    m.write_text(
        m.read_text().replace('perturbation = "perturbation"', 'perturbation = "no_such_column"', 1)
    )
    out = tmp_path / "out"
    if existed:
        out.mkdir()
    with pytest.raises(Exception, match="no_such_column"):
        build(m, out, jobs=1, progress=False)
    assert out.exists() == existed
    if existed:
        assert list(out.iterdir()) == []
