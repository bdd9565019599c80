"""zarr v3 stores: one folder per shard, one array per column, chunked so a reader can also slice.

Written through zarr-python. Columns may be lazy array-likes (the pack stage gathers big CSR columns chunk
by chunk into reused buffers): each is written one chunk-sized row range at a time, so a whole shard is
never assembled in memory.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

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


def chunk_rows(a: Any) -> int:
    row_bytes = max(1, np.dtype(a.dtype).itemsize * int(np.prod(a.shape[1:], dtype=np.int64)))
    return max(1, min(a.shape[0], CHUNK_BYTES // row_bytes)) if len(a.shape) else 1


def _array_like(a: Any) -> Any:
    """ndarrays as little-endian contiguous arrays; lazy columns (shape, dtype, row slicing) as they are."""
    if isinstance(a, np.ndarray) or not hasattr(a, "dtype"):
        a = np.ascontiguousarray(a)
        return a.astype(a.dtype.newbyteorder("<"), copy=False)
    return a


@register_writer
class ZarrShardWriter(ShardWriter):
    encoding = "zarr"
    suffix = ".zarr"

    def write(self, path: Path, columns: Mapping[str, Any], tables: Collection[str] = (),
              codecs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        import zarr

        from loaders.fieldcodecs import zarr_codec

        group = zarr.open_group(zarr.storage.LocalStore(str(path)), mode="w-", zarr_format=3)
        compressors = zarr_compressors(self.codec)
        own = {k: [zarr_codec(c, f"column {k!r}")] for k, c in (codecs or {}).items() if k in columns}
        for key in sorted(columns):
            a = _array_like(columns[key])
            rows = chunk_rows(a)
            arr = group.create_array(key, shape=tuple(a.shape), dtype=a.dtype, chunks=(rows, *a.shape[1:]),
                                     compressors=own.get(key, compressors), fill_value=0,
                                     config={"write_empty_chunks": True})  # skips a full compare per chunk
            if isinstance(a, np.ndarray):
                if a.size:
                    arr[...] = a
                continue
            for lo in range(0, a.shape[0], rows):  # lazy: one chunk of rows in memory at a time
                arr[lo:lo + rows] = np.asarray(a[lo:lo + rows])
