"""Physical shard encodings, write side: one ShardWriter per encoding, looked up in a registry."""

from __future__ import annotations

from pipeline.writers import tar_writer as _tar_writer  # noqa: F401  (registers "tar")
from pipeline.writers import zarr_writer as _zarr_writer  # noqa: F401  (registers "zarr")
from pipeline.writers.base import WRITERS, Codec, ShardWriter, get_writer

__all__ = ["WRITERS", "Codec", "ShardWriter", "get_writer"]
