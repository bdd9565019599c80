"""Content digests, named: ``"<algorithm>:<hex>"`` strings and the registry that reads them.

Why named: the build hashes every source (fingerprints) and every shard (index digests), and
sha256 cost more CPU than compressing (docs/FORMAT.md, "Digests"); new builds write xxh3-128
(``xxhash``), but datasets written with sha256 must keep verifying and loading. So a digest
carries its algorithm's name and a reader dispatches on it through ``DIGESTS`` (a bare hex
string, as index versions 1-3 stored under ``sha256`` keys, is sha256). Adding an algorithm is
one registration, never an if-chain in the readers.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import xxhash

from loaders.format.errors import FormatError
from loaders.plugins.registry import Registry


class Hasher(Protocol):
    """What ``hashlib`` and ``xxhash`` objects share: feed bytes, read the hex digest."""

    def update(self, data: Any, /) -> None: ...
    def hexdigest(self) -> str: ...


DIGESTS: Registry[Callable[[], Hasher]] = Registry("digest algorithm", error=FormatError)
DIGESTS.register("xxh3_128", xxhash.xxh3_128)
DIGESTS.register("sha256", hashlib.sha256)
LEGACY = "sha256"  # what an untagged hex digest (index versions 1-3) is
DIGEST = "xxh3_128"  # what a build writes
DIGESTS.set_default(DIGEST)
READ_BLOCK = 1 << 22  # file reads while hashing: 4 MiB, large enough that the hash dominates


def algorithm(digest: str) -> str:
    """The algorithm named by ``digest`` (``"xxh3_128:..."``; bare hex is sha256)."""
    name, sep, _ = digest.partition(":")
    return name if sep else LEGACY


def tagged(digest: str) -> str:
    """``digest`` with its algorithm named (a bare hex string becomes ``"sha256:<hex>"``)."""
    return digest if ":" in digest or not digest else f"{LEGACY}:{digest}"


def hasher(name: str = DIGEST) -> Hasher:
    """A fresh hasher of algorithm ``name``; an unknown name is a ``FormatError`` listing the
    known ones (a dataset written by a newer shardsmith)."""
    return DIGESTS.get(name)()


def finish(name: str, h: Hasher) -> str:
    return f"{name}:{h.hexdigest()}"


def bytes_digest(data: Any, name: str = DIGEST) -> str:
    """The named digest of one buffer."""
    h = hasher(name)
    h.update(data)
    return finish(name, h)


_BLOCK = threading.local()  # per thread: the buffer files are read into while hashing


def feed_file(h: Hasher, path: str | Path) -> int:
    """Feed one file's bytes to ``h`` in ``READ_BLOCK`` pieces; returns the bytes read.

    Read into one reused buffer per thread: a fresh 4 MiB ``bytes`` per read is a fresh
    allocation whose pages are faulted in again (the build trims the heap, pipeline.memory);
    reused, a read is one copy (~15% less CPU per hashed byte here)."""
    buf = getattr(_BLOCK, "view", None)
    if buf is None:
        buf = _BLOCK.view = memoryview(bytearray(READ_BLOCK))
    total = 0
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(buf[:n])
            total += n
    return total


def feed_mapped(h: Hasher, path: str | Path) -> int:
    """``feed_file`` without the copy: each ``READ_BLOCK`` window of the file is mapped and hashed
    in place (half the CPU of reading it from the page cache; a window at a time keeps the mapped
    pages, which count as resident, to one block). Only for a file this process wrote and nothing
    else changes while it is read (the build's own shards): a file truncated meanwhile is a
    SIGBUS, not an error."""
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        for off in range(0, size, READ_BLOCK):
            n = min(READ_BLOCK, size - off)
            try:
                window = mmap.mmap(fh.fileno(), n, offset=off, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                if off:
                    raise
                return feed_file(h, path)  # a file system that cannot map files: read it
            with window:
                h.update(window)
    return size


def file_digest(path: str | Path, name: str = DIGEST) -> str:
    """The named digest of one file's bytes."""
    h = hasher(name)
    feed_file(h, path)
    return finish(name, h)


def feed_shard(h: Hasher, parts: Iterable[tuple[str, Any]]) -> None:
    """Feed a shard's files as its content hash walks them: for each (relative path, bytes) in
    sorted order, the path (none for a single-file shard) and NUL, the bytes, NUL. The same walk
    for every algorithm, so a sha256 digest of index versions 1-3 is recomputed unchanged."""
    for rel, data in parts:
        if rel:
            h.update(rel.encode() + b"\0")
        h.update(data)
        h.update(b"\0")


def matches(expected: str, parts: Iterable[tuple[str, Any]]) -> tuple[bool, str]:
    """(whether the shard content ``parts`` hashes to ``expected``, the digest computed), with the
    algorithm ``expected`` names."""
    name = algorithm(expected)
    h = hasher(name)
    feed_shard(h, parts)
    got = finish(name, h)
    return got == tagged(expected), got


def as_stored_before(digest: str) -> str:
    """``digest`` as index versions 1-3 wrote it (bare hex for sha256; others unchanged): for
    identities derived from digests before they were named (a resume state's dataset
    fingerprint), so that such an identity saved on an old dataset still matches it."""
    name, sep, hexd = digest.partition(":")
    return hexd if sep and name == LEGACY else digest
