"""Physical shard encodings, read side: a registry of readers that return the logical columns.

A reader knows how bytes are laid out (zarr store, tar members), never what a column means: key
names come from ``loaders.format``. The zarr reader (and :class:`Column`, which decodes a column
into a caller's buffer) is ``loaders.format.zarr_reader``; the tar encoding (member layout and
reader) is ``loaders.format.tar_reader``; both are registered below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from loaders.format import FormatError
from loaders.format.tar_reader import read_tar_shard
from loaders.format.zarr_reader import (  # noqa: F401 (callers find the zarr reader's names here too)
    Column,
    import_zarr,
    open_zarr_columns,
    read_zarr_shard,
)
from loaders.plugins.registry import Registry

ShardReader = Callable[[Path, Sequence[str]], dict[str, np.ndarray]]
READERS: Registry[ShardReader] = Registry("shard encoding", error=FormatError)


def register_reader(encoding: str) -> Callable[[ShardReader], ShardReader]:
    def deco(fn: ShardReader) -> ShardReader:
        return READERS.register(encoding, fn)

    return deco


READERS.register("zarr", read_zarr_shard)  # loaders/format/zarr_reader.py
READERS.register("tar", read_tar_shard)  # loaders/format/tar_reader.py


def open_shard(path: str | Path, encoding: str, keys: Sequence[str]) -> dict[str, Column]:
    """The columns ``keys`` of a shard, to decode into buffers of the caller's
    (``Column.read_into``). zarr reads only metadata here; other encodings are decoded whole by
    their reader."""
    path = Path(path)
    if encoding == "zarr" and path.exists():
        return dict(open_zarr_columns(path, keys))
    return {
        k: Column(path, k, a.shape, a.dtype, a) for k, a in read_shard(path, encoding, keys).items()
    }


def read_shard(path: str | Path, encoding: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.exists():
        raise FormatError(f"{path}: shard is missing")
    if encoding not in READERS:
        raise FormatError(f"{path}: no reader for encoding {encoding!r} (known: {READERS.names()})")
    return READERS.get(encoding)(path, keys)
