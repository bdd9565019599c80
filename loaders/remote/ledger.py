"""The node cache's ledger on disk, shared by every process of the node through files and
``flock`` only: per generation folder, ``.pins/<shard>.pin`` (held shared while a shard is needed;
its content the shard's bytes in the cache, its mtime the last use) and ``.pins/<shard>.dl`` (held
while it downloads); one lock file for the whole cache folder while space is reserved. What
:mod:`loaders.remote.cache` and :mod:`loaders.remote.reuse` read and write; no client, no thread.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

from loaders.format.names import plain_name

PINS = ".pins"  # a generation folder's ledger of pins


def evict(cache_dir: Path, target: int) -> tuple[int, int]:
    """Evict least recently used, unpinned shards of every dataset under ``cache_dir`` until the
    bytes held are at most ``target`` (the caller holds the folder's lock); ``(bytes held, bytes
    pinned)`` after it."""
    ledger = []
    for pin in cache_dir.glob(f"*/*/{PINS}/*.pin"):
        try:
            size, mtime = read_size(pin), pin.stat().st_mtime_ns
        except OSError:
            continue
        if size:
            ledger.append((mtime, pin, size))
    used = sum(s for _, _, s in ledger)
    pinned = 0
    for _, pin, size in sorted(ledger, key=lambda t: t[0]):
        if used <= target:
            break
        fd = os.open(pin, os.O_RDWR)
        try:
            # pinned, or in flight (its download lock held: a dropped reader's read-ahead pins
            # it no more, and zeroed now its size came back when it landed): never evicted
            if not (_try_lock(fd) and _idle(pin.with_suffix(".dl"))):
                pinned += size
                continue
            name = unquote(pin.name[: -len(".pin")])
            if not plain_name(name):  # a pin file planted to delete what it names: skipped
                continue
            remove_path(pin.parent.parent / "shards" / name)
            os.ftruncate(fd, 0)
            used -= size
        finally:
            os.close(fd)
    return used, pinned


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _idle(dl: Path) -> bool:
    """Whether no process downloads the shard of this download lock now."""
    try:
        fd = os.open(dl, os.O_RDWR)
    except FileNotFoundError:  # never downloaded here (a copy adopted from another generation)
        return True
    try:
        return _try_lock(fd)
    finally:
        os.close(fd)


def cache_bytes(cache_dir: str | Path) -> int:
    """Bytes held in the cache folder per its ledger (shards cached or being downloaded)."""
    return sum(read_size(p) for p in Path(cache_dir).glob(f"*/*/{PINS}/*.pin"))


def read_size(pin: Path) -> int:
    text = pin.read_text().strip()
    return int(text) if text.isdigit() else 0


def write_size(pin: Path, size: int) -> None:
    """The ledger entry of a shard: written in place (the file is a lock: never replaced)."""
    fd = os.open(pin, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.ftruncate(fd, 0)
        if size:
            os.pwrite(fd, str(int(size)).encode(), 0)
        touch(fd)
    finally:
        os.close(fd)


def touch(fd: int) -> None:
    """Last use, for least-recently-used eviction."""
    try:
        os.utime(fd)
    except OSError:  # a file of another user on a shared cache: its order is only a hint
        pass


def remove_path(path: Path) -> None:
    """A file or folder gone (a temporary download, an evicted shard)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
