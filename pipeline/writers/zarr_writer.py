"""zarr v3 stores: one folder per shard, one array per column, chunked so a reader can also slice."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.writers.base import Codec, ShardWriter, register_writer

CHUNK_BYTES = 8 << 20  # big chunks: the loader decodes whole shards; few chunks = little per-chunk overhead


def zarr_compressors(codec: Codec) -> list[object]:
    from zarr.codecs import BloscCodec, ZstdCodec

    if codec.name == "none":
        return []
    if codec.name == "zstd":
        return [ZstdCodec(level=codec.level)]
    cname = codec.name.split("-", 1)[1]
    return [BloscCodec(cname=cname, clevel=codec.level, shuffle="shuffle")]


@register_writer
class ZarrShardWriter(ShardWriter):
    encoding = "zarr"
    suffix = ".zarr"

    def write(self, path: Path, columns: Mapping[str, np.ndarray]) -> None:
        import zarr

        group = zarr.open_group(zarr.storage.LocalStore(str(path)), mode="w-", zarr_format=3)
        compressors = zarr_compressors(self.codec)
        for key in sorted(columns):
            a = np.ascontiguousarray(columns[key])
            row_bytes = max(1, a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64)))
            rows = max(1, min(a.shape[0], CHUNK_BYTES // row_bytes)) if a.ndim else 1
            arr = group.create_array(key, shape=a.shape, dtype=a.dtype, chunks=(rows, *a.shape[1:]),
                                     compressors=compressors, fill_value=0,
                                     config={"write_empty_chunks": True})  # skips a full compare per chunk
            if a.size:
                arr[...] = a
