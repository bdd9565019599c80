"""Physical shard encodings, read side: a registry of readers that return the logical columns.

A reader knows how bytes are laid out (zarr store, tar members), never what a column means:
key names come from ``loaders.format``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from loaders.format import FormatError

ShardReader = Callable[[Path, Sequence[str]], dict[str, np.ndarray]]
READERS: dict[str, ShardReader] = {}


def register_reader(encoding: str) -> Callable[[ShardReader], ShardReader]:
    def deco(fn: ShardReader) -> ShardReader:
        READERS[encoding] = fn
        return fn

    return deco


@register_reader("zarr")
def read_zarr_shard(path: Path, keys: Sequence[str]) -> dict[str, np.ndarray]:
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r")
        return {k: np.asarray(group[k][...]) for k in keys}
    except FileNotFoundError:
        raise FormatError(f"{path}: shard is missing") from None
    except KeyError as e:
        raise FormatError(f"{path}: shard has no column {e}") from None
    except FormatError:
        raise
    except Exception as e:  # corrupt chunk, bad metadata: name the shard, never hang
        raise FormatError(f"{path}: cannot read shard ({type(e).__name__}: {e})") from e


def read_shard(path: str | Path, encoding: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.exists():
        raise FormatError(f"{path}: shard is missing")
    try:
        reader = READERS[encoding]
    except KeyError:
        raise FormatError(f"{path}: no reader for encoding {encoding!r} (known: {sorted(READERS)})") from None
    return reader(path, keys)
