"""Source fingerprints: a content digest (named, ``loaders.format.digests``: xxh3-128) and the stat that
vouches for it, the key of every reuse decision.

Why a stat cache: a nightly rebuild of unchanged sources must not read them again to learn that
they are unchanged. A digest is reused when the file's (size, mtime_ns, inode, ctime_ns) equal
those recorded with it by the last committed build (``OUT/.build-inputs.json``, "stats"): a
rewrite in place that keeps the size changes mtime, and one that also sets mtime back (``touch
-d``, ``cp -p``, ``rsync -t``) still changes ctime, which user space cannot set; a replaced file
changes inode. ``shardsmith build --rehash`` ignores the cache.

A source's *companions* are the other files its records' bytes or metadata are read from (a
``.npy`` volume's ``<stem>.json`` sidecar, an ``.nhdr``'s data file, a spike frame's paired
images: ``Kind.source_companions``). They are part of the fingerprint: the digest folds in each
present companion's name and digest, and the stat cache keeps a signature of their stats (a
missing candidate counted too), so adding, editing or removing one changes the source, as an edit
of the source itself does (its shards are rewritten, the others reused; ``--dry-run`` says so). A
source with no companion present has exactly the digest it had before companions existed.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loaders.format.digests import DIGEST, algorithm, feed_file, finish, hasher
from pipeline.errors import SourceError

STAT_KEYS = ("size", "mtime_ns", "inode", "ctime_ns", "companions")
StatKey = tuple[int, int, int, int, "str | None"]


@dataclass(frozen=True)
class Fingerprint:
    path: str
    size: int
    mtime_ns: int
    digest: str  # "xxh3_128:<hex>" (loaders.format.digests)
    inode: int = 0
    ctime_ns: int = 0
    companions: str | None = None  # signature of the companions' stats (None: none present)

    def to_json(self) -> dict[str, object]:
        """The index's source entry (inode and ctime stay in the stat cache: they are this
        machine's, and the index's bytes should not depend on them)."""
        return {
            "path": self.path,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "digest": self.digest,
        }

    def stat_json(self) -> dict[str, object]:
        """The stat cache's entry: the stat that vouches for the digest, and the digest."""
        entry: dict[str, object] = {
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "inode": self.inode,
            "ctime_ns": self.ctime_ns,
            "digest": self.digest,
        }
        if self.companions is not None:
            entry["companions"] = self.companions
        return entry


class ReadCounter:
    """Source bytes read to fingerprint them, in this process (tests and benchmarks: a no-change
    nightly reads none)."""

    def __init__(self) -> None:
        self.bytes = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes += n


HASHED = ReadCounter()


def file_digest(path: Path) -> str:
    """The digest of one file's bytes, counted in ``HASHED``."""
    h = hasher(DIGEST)
    HASHED.add(feed_file(h, path))
    return finish(DIGEST, h)


def folder_files(path: Path) -> list[Path]:
    """A folder source's files (a DICOM series): the regular, non-hidden files directly in it,
    sorted."""
    return sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())


def source_stat(path: Path) -> tuple[int, int]:
    """(size, mtime_ns) of a source file; of a folder source, its files' total size and the latest
    mtime of the folder and its files (an edited, added or removed file changes one of them)."""
    return stat_key(path)[:2]


def present(companions: Sequence[Path]) -> list[Path]:
    """The companion candidates that exist (a missing sidecar is no input, until it is added)."""
    return [p for p in companions if p.exists()]


def companions_signature(path: Path, companions: Sequence[Path]) -> str | None:
    """A short digest of the present companions' names and stats (size, mtime, inode, ctime);
    None when none is present, so such a source's stat cache entry reads as before."""
    found = present(companions)
    if not found:
        return None
    rows = []
    for p in found:
        st = p.stat()
        rows.append([_name(path, p), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns])
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:32]


def _name(path: Path, companion: Path) -> str:
    """A companion's name relative to its source's folder: the digest does not depend on where
    the dataset's inputs live."""
    return os.path.relpath(companion, path.parent)


def stat_key(path: Path, companions: Sequence[Path] = ()) -> StatKey:
    """(size, mtime_ns, inode, ctime_ns, companions) of a source: of a folder source, its files'
    total size, the latest mtime and ctime of the folder and its files, and the folder's inode;
    ``companions``: :func:`companions_signature`."""
    st = path.stat()
    extra = companions_signature(path, companions)
    if not path.is_dir():
        return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, extra
    stats = [p.stat() for p in folder_files(path)]
    return (
        sum(s.st_size for s in stats),
        max([st.st_mtime_ns, *(s.st_mtime_ns for s in stats)]),
        st.st_ino,
        max([st.st_ctime_ns, *(s.st_ctime_ns for s in stats)]),
        extra,
    )


def folder_digest(path: Path) -> str:
    """One digest over a folder source's files: each file's name and digest, in name order."""
    h = hasher(DIGEST)
    for p in folder_files(path):
        h.update(p.name.encode() + b"\0" + file_digest(p).encode() + b"\n")
    return finish(DIGEST, h)


def cached(entry: Mapping[str, object] | None, key: StatKey) -> str | None:
    """The digest a stat cache entry holds if its stat is ``key`` and its algorithm the one a build
    writes (a sha256 of an older build is recomputed once), else None."""
    if not entry or tuple(entry.get(k) for k in STAT_KEYS) != key:
        return None
    digest = str(entry.get("digest") or "")
    return digest if digest and algorithm(digest) == DIGEST else None


def content_digest(path: Path, companions: Sequence[Path] = ()) -> str:
    """The source's digest; with companions present, one digest over it and each companion's
    name and digest."""
    digest = folder_digest(path) if path.is_dir() else file_digest(path)
    found = present(companions)
    if not found:
        return digest
    h = hasher(DIGEST)
    h.update(digest.encode() + b"\n")
    for p in found:
        h.update(_name(path, p).encode() + b"\0" + file_digest(p).encode() + b"\n")
    return finish(DIGEST, h)


def fingerprint(
    path: Path,
    cache: Mapping[str, Mapping[str, object]] | None = None,
    companions: Sequence[Path] = (),
) -> Fingerprint:
    """stat + content digest of ``path`` and its ``companions``; the digest is reused from the
    stat cache (``cache``: path -> the last build's ``Fingerprint.stat_json``) when the stat is
    unchanged, else the source is read."""
    try:
        key = stat_key(path, companions)
    except OSError as e:
        raise SourceError(path, f"cannot stat ({e.strerror})") from None
    digest = cached((cache or {}).get(str(path)), key)
    if digest is None:
        try:
            digest = content_digest(path, companions)
        except OSError as e:
            raise SourceError(
                Path(e.filename or path), f"cannot read ({e.strerror})"
            ) from None
    return Fingerprint(str(path), key[0], key[1], digest, key[2], key[3], key[4])
