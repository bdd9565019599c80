"""Source fingerprints: size, mtime and a content hash, the key of every reuse decision."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import SourceError


@dataclass(frozen=True)
class Fingerprint:
    path: str
    size: int
    mtime_ns: int
    sha256: str

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "sha256": self.sha256,
        }


def file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def folder_files(path: Path) -> list[Path]:
    """A folder source's files (a DICOM series): the regular, non-hidden files directly in it,
    sorted."""
    return sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_file())


def source_stat(path: Path) -> tuple[int, int]:
    """(size, mtime_ns) of a source file; of a folder source, its files' total size and the latest
    mtime of the folder and its files (an edited, added or removed file changes one of them)."""
    st = path.stat()
    if not path.is_dir():
        return st.st_size, st.st_mtime_ns
    stats = [p.stat() for p in folder_files(path)]
    return sum(s.st_size for s in stats), max([st.st_mtime_ns, *(s.st_mtime_ns for s in stats)])


def folder_sha256(path: Path) -> str:
    """One hash over a folder source's files: each file's name and content hash, in name order."""
    h = hashlib.sha256()
    for p in folder_files(path):
        h.update(p.name.encode() + b"\0" + file_sha256(p).encode() + b"\n")
    return h.hexdigest()


def fingerprint(path: Path, cache: Mapping[str, Mapping[str, object]] | None = None) -> Fingerprint:
    """size + mtime + content hash; the hash is reused from the last build when size and mtime are
    unchanged."""
    try:
        size, mtime_ns = source_stat(path)
    except OSError as e:
        raise SourceError(path, f"cannot stat ({e.strerror})") from None
    old = (cache or {}).get(str(path))
    if old and old.get("size") == size and old.get("mtime_ns") == mtime_ns:
        return Fingerprint(str(path), size, mtime_ns, str(old["sha256"]))
    try:
        sha = folder_sha256(path) if path.is_dir() else file_sha256(path)
    except OSError as e:
        raise SourceError(path, f"cannot read ({e.strerror})") from None
    return Fingerprint(str(path), size, mtime_ns, sha)
