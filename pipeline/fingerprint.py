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
        return {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns, "sha256": self.sha256}


def file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def fingerprint(path: Path, cache: Mapping[str, Mapping[str, object]] | None = None) -> Fingerprint:
    """size + mtime + content hash; the hash is reused from the last build when size and mtime are unchanged."""
    try:
        st = path.stat()
    except OSError as e:
        raise SourceError(path, f"cannot stat ({e.strerror})") from None
    old = (cache or {}).get(str(path))
    if old and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns:
        return Fingerprint(str(path), st.st_size, st.st_mtime_ns, str(old["sha256"]))
    return Fingerprint(str(path), st.st_size, st.st_mtime_ns, file_sha256(path))
