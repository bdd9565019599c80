"""Files as the dataset contract needs them: atomic replacement with the process umask's mode, and
content hashes and stored sizes of a shard (a file, or a folder such as a zarr store)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from loaders.errors import FormatError


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


def content_hash(path: str | Path) -> str:
    """sha256 of a file, or of a folder as the sorted (relative path, bytes) of every file in it."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    if not files and not path.exists():
        raise FormatError(f"{path}: missing")
    for p in files:
        if p != path:
            h.update(p.relative_to(path).as_posix().encode() + b"\0")
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def stored_bytes(path: str | Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
