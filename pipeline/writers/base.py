"""The ShardWriter interface: write a dict of logical columns to a path, deterministically."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from loaders.plugins.registry import Registry

CODECS = ("blosc-lz4", "blosc-zstd", "zstd", "none")
# Compression levels each codec accepts (blosc: 0-9; zstd: 1-22; "none" ignores it): out of range,
# blosc fails deep inside a pack task, so the manifest refuses it up front.
LEVELS: dict[str, range] = {
    "blosc-lz4": range(0, 10),
    "blosc-zstd": range(0, 10),
    "zstd": range(1, 23),
    "none": range(0, 23),
}


@dataclass(frozen=True)
class Codec:
    """Compression of shard columns. lz4 decodes ~2 GB/s (the loader's choice); zstd packs 2-3x
    smaller."""

    name: str = "blosc-lz4"
    level: int = 5

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise ValueError(f"unknown codec {self.name!r} (expected one of {CODECS})")

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "level": self.level}


def contiguous_or_lazy(a: Any) -> Any:
    """A column as a writer takes it: an ndarray (or a list) as a C-contiguous array (the bytes a
    writer stores follow memory order); a lazy column (shape, dtype, contiguous row slices: a
    spilled shard's rows, `pipeline.modalities.perturbation.spill.LazyColumn`) as it is, for the
    writer to slice a chunk or block at a time."""
    if isinstance(a, np.ndarray) or not hasattr(a, "dtype"):
        return np.ascontiguousarray(a)
    return a


class ShardWriter(ABC):
    encoding: ClassVar[str]
    suffix: ClassVar[str]

    def __init__(self, codec: Codec) -> None:
        self.codec = codec

    @abstractmethod
    def write(
        self,
        path: Path,
        columns: Mapping[str, np.ndarray],
        tables: Collection[str] = (),
        codecs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Write every column to `path` (which does not exist yet). Same columns -> same bytes.
        `tables`: the keys that are shard tables (rows of local row ids, not one entry per
        record). `codecs`: column key -> its field's own codec config (``loaders.format.codecs``),
        used instead of the dataset's codec."""


WRITERS: Registry[type[ShardWriter]] = Registry("shard encoding")


def register_writer(cls: type[ShardWriter]) -> type[ShardWriter]:
    return WRITERS.register(cls.encoding, cls)


def get_writer(encoding: str, codec: Codec) -> ShardWriter:
    return WRITERS.get(encoding)(codec)
