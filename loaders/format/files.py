"""Files as the dataset contract needs them: atomic replacement with the process umask's mode, and
content hashes and stored sizes of a shard (a file, or a folder such as a zarr store)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loaders.format.digests import DIGEST, Hasher, algorithm, feed_file, finish, hasher, tagged
from loaders.format.errors import FormatError


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(
            fd, 0o666 & ~process_umask()
        )  # mkstemp makes 0600: give it the mode open() gives shards
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def process_umask() -> int:
    """The process umask, read without changing it (os.umask sets it, racing other threads creating
    files)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc (not Linux): the classic read, set back at once
    os.umask(mask)
    return mask


def content_hash(
    path: str | Path, name: str = DIGEST, feed: Callable[[Hasher, Path], int] = feed_file
) -> str:
    """The named digest (``loaders.format.digests``; ``name``: the algorithm) of a file, or of a folder
    as the sorted (relative path, bytes) of every file in it. ``feed``: how a file's bytes reach
    the hasher (``feed_mapped`` for a shard the caller has just written)."""
    path = Path(path)
    h = hasher(name)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    if not files and not path.exists():
        raise FormatError(f"{path}: missing")
    for p in files:
        if p != path:
            h.update(p.relative_to(path).as_posix().encode() + b"\0")
        feed(h, p)
        h.update(b"\0")
    return finish(name, h)


def shard_digest_matches(expected: str | Any, path: str | Path) -> bool:
    """Whether the shard (or condition table) at ``path`` has the content digest ``expected``:
    an index entry (``ShardEntry``/``ConditionsRef``: its ``digest``) or a digest string, with
    whichever algorithm it names (``"xxh3_128:..."``; bare hex is sha256). The one check for code
    that fetched or copied a shard (a remote cache) before serving it; a missing file is False."""
    digest = tagged(expected if isinstance(expected, str) else expected.digest)
    try:
        return content_hash(path, algorithm(digest)) == digest
    except (FormatError, OSError):
        return False


def stored_bytes(path: str | Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
