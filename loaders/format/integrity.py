"""Integrity on read: a shard's bytes are checked against the index the loader opened before any is
decoded.

Why here and not in zarr: a zarr chunk file that is missing reads as the array's fill value (0), so
a deleted chunk of a code column silently relabels its rows as ``vocab[0]`` and one of a table of
row ids makes every unit refer to row 0; a flipped byte in a blosc chunk may decode "fine". So the
loader reads a shard's files once into memory, checks their digest against ``index.json`` (the
content hash the build recorded, ``loaders.format.content_hash``: sorted relative paths and bytes,
with the algorithm the index names: xxh3-128 from index version 4, sha256 before) and checks that
every chunk of every array is present, then decodes from exactly the bytes it checked (no second
read, no window between check and use). sha256 ran at ~1.6 GB/s over the *compressed* bytes, a
third of a window's decode; xxh3-128 runs at memory speed (docs/FORMAT.md, "Digests"). A process
still hashes a shard on its first read and again only when a file of it changed identity (inode,
size, mtime, ctime); the chunk count and the file listing are checked on every read.

A shard that is missing or does not match is either corruption or a rebuild: when ``index.json``
on disk is no longer the one this loader opened, the error says "dataset rebuilt since this
loader opened it; reopen" (:class:`DatasetRebuilt`, never skipped); otherwise it is corruption,
raised or skipped per ``on_corrupt``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from loaders.format import FormatError, index_sha256, read_index_bytes
from loaders.format.digests import matches
from loaders.format.forksafe import fork_safe_lock
from loaders.format.readers import Column, import_zarr, open_zarr_columns
from loaders.format.tar_reader import read_tar_shard
from loaders.format.values import FieldSpec

ON_CORRUPT = (
    "raise",
    "skip",
)  # a shard that fails its checks: raise naming it, or skip it and count it


class DatasetRebuilt(FormatError):
    """The dataset was rebuilt since this loader opened it (its shards are gone or changed): reopen
    it."""


def check_on_corrupt(value: str) -> str:
    if value not in ON_CORRUPT:
        raise ValueError(f"on_corrupt={value!r}: expected one of {ON_CORRUPT}")
    return value


@dataclass(frozen=True)
class Generation:
    """The generation of a dataset a loader opened: its root and the sha256 of the index.json bytes
    it read."""

    root: str
    index_sha256: str

    def rebuilt(self) -> bool:
        """Whether ``index.json`` on disk is now another generation than the one opened."""
        try:
            return index_sha256(read_index_bytes(self.root)) != self.index_sha256
        except FormatError:  # index.json gone: not the opened generation either
            return True

    def explain(self, error: FormatError, shard: str) -> FormatError:
        """``error`` (a shard missing or not matching), as :class:`DatasetRebuilt` when the index
        has changed."""
        if isinstance(error, DatasetRebuilt) or not self.rebuilt():
            return error
        return DatasetRebuilt(
            f"{shard}: dataset rebuilt since this loader opened it (index.json of {self.root} "
            f"changed, and this shard of the opened generation is gone or changed: {error}); "
            "reopen the ShardDataset"
        )


def _files(path: Path) -> list[Path]:
    """The files of a shard in content-hash order (as ``loaders.format.content_hash`` walks them)."""
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


# Shards whose bytes hashed right in this process, with the (name, inode, size, mtime, ctime) of
# every file at that time: while nothing of that changes, a re-read (every epoch) skips the hash.
# Any write, rename, deletion or addition through the filesystem changes it (ctime cannot be set
# from user space), so only silent media corruption after the first check goes unseen;
# ``verify="always"`` hashes every read.
_VERIFIED: dict[str, tuple[tuple[tuple[object, ...], ...], str]] = {}
_VERIFIED_LOCK = fork_safe_lock()  # a forked worker gets it unlocked (loaders/format/forksafe.py)


def read_checked(path: Path, digest: str | None, always: bool = False) -> dict[str, bytes]:
    """Every file of a shard (a zarr folder: relative path -> bytes; a single file: ``{"":
    bytes}``), its content checked against ``digest`` (named: ``loaders.format.digests``) unless that is
    None or empty (an index that records none): on the first read in this process, whenever a
    file's identity changed since, or always (``always``)."""
    if not path.exists():
        raise FormatError(f"{path}: shard is missing")
    out: dict[str, bytes] = {}
    sigs = []
    try:
        for p in _files(path):
            rel = "" if p == path else p.relative_to(path).as_posix()
            with open(p, "rb") as fh:
                out[rel] = fh.read()
                st = os.fstat(fh.fileno())  # after the read: a write during it shows in mtime/ctime
            sigs.append((rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    except OSError as e:
        raise FormatError(f"{path}: cannot read shard ({type(e).__name__}: {e})") from e
    if not digest:
        return out
    key, seen = str(path), (tuple(sigs), digest)
    with _VERIFIED_LOCK:
        if not always and _VERIFIED.get(key) == seen:
            return out
    ok, got = matches(digest, out.items())
    if not ok:
        raise FormatError(
            f"{path}: content hash mismatch: index.json says {digest[:25]}..., the shard's bytes "
            f"hash to {got[:25]}... (a chunk changed, went missing or was added)"
        )
    with _VERIFIED_LOCK:
        _VERIFIED[key] = seen
    return out


def _check_chunks(path: Path, files: dict[str, bytes], columns: dict[str, Column]) -> None:
    """Every chunk of every array read is present: zarr would read a missing one as the fill value."""
    for key, col in columns.items():
        arr = col.source
        grid = getattr(arr, "cdata_shape", None)
        if grid is None:
            continue
        want = math.prod(grid)
        prefix = f"{key}/c"
        have = sum(1 for f in files if f == prefix or f.startswith(prefix + "/"))
        if have != want:
            raise FormatError(
                f"{path}: column {key!r} has {have} of its {want} chunk files (a missing chunk would "
                "read as zeros)"
            )


def open_checked(
    path: str | Path, encoding: str, keys: Sequence[str], digest: str | None, always: bool = False
) -> dict[str, Column]:
    """The columns ``keys`` of a shard, decoded later (``Column.read_into``) from the bytes checked
    here."""
    path = Path(path)
    files = read_checked(path, digest, always)
    if encoding == "tar":
        return {
            k: Column(path, k, a.shape, a.dtype, a)
            for k, a in read_tar_shard(path, keys, files[""]).items()
        }
    if encoding != "zarr":
        raise FormatError(f"{path}: no checked reader for encoding {encoding!r}")
    import_zarr()
    from zarr.core.buffer import (
        default_buffer_prototype,  # import weight: zarr (~0.3 s), only for zarr shards
    )
    from zarr.storage import MemoryStore  # import weight: zarr (~0.3 s), only for zarr shards

    proto = default_buffer_prototype().buffer
    store = MemoryStore({k: proto.from_bytes(v) for k, v in files.items()}, read_only=True)
    columns = open_zarr_columns(path, keys, store)
    _check_chunks(path, files, columns)
    return columns


def bounded_fields(fields: Sequence[FieldSpec], bounds: Mapping[str, int]) -> list[FieldSpec]:
    """``fields`` with each dense field named in ``bounds`` (the sample type's ``field_bounds``:
    e.g. codes into a vocabulary) bounded by it, whatever the index's own ``bound`` says (an index
    without bounds, or with a wrong one, still never serves a code without a label)."""
    out = []
    for f in fields:
        cap = bounds.get(f.name)
        if cap is not None and f.layout == "dense" and (f.bound is None or f.bound > cap):
            f = replace(f, bound=int(cap))
        out.append(f)
    return out
