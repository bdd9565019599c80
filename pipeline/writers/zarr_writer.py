"""zarr v3 stores: one folder per shard, one array per column, chunked so a reader can also slice.

Written with zarr-python's bytes, mostly not through zarr-python: `pipeline.writers.zarr_direct`
writes each array's files itself (zarr's async machinery cost more CPU than the compression),
from templates checked against zarr-python once per process; an array it cannot vouch for goes
through zarr-python (`_write_with_zarr`). Columns may be lazy array-likes (the pack stage gathers
big CSR columns chunk by chunk into reused buffers): each is written one chunk-sized row range at
a time, so a whole shard is never assembled in memory.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from loaders.format.codecs import zarr_codec
from pipeline.writers.base import Codec, ShardWriter, contiguous_or_lazy, register_writer

CHUNK_BYTES = (
    8 << 20
)  # big chunks: the loader decodes whole shards; few chunks = little per-chunk overhead


def zarr_compressors(codec: Codec) -> list[object]:
    from zarr.codecs import BloscCodec, ZstdCodec  # import weight: zarr

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
    """`contiguous_or_lazy`, with arrays little-endian (zarr's bytes codec stores little-endian)."""
    a = contiguous_or_lazy(a)
    return a.astype(a.dtype.newbyteorder("<"), copy=False) if isinstance(a, np.ndarray) else a


@register_writer
class ZarrShardWriter(ShardWriter):
    encoding = "zarr"
    suffix = ".zarr"

    def write(
        self,
        path: Path,
        columns: Mapping[str, Any],
        tables: Collection[str] = (),
        codecs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        from pipeline.writers import (
            zarr_direct,
        )  # import weight: zarr, only when a zarr shard is written

        compressors = zarr_compressors(self.codec)
        own = codecs_of(columns, codecs)
        arrays = {key: _array_like(columns[key]) for key in sorted(columns)}
        direct = {
            key: t
            for key, a in arrays.items()
            if len(a.shape)
            and key not in own
            and (t := zarr_direct.array_template(a.dtype, tuple(a.shape[1:]), compressors))
            is not None
        }
        if len(direct) < len(
            arrays
        ):  # some array needs zarr-python (its own codec, an unverified signature)
            _write_with_zarr(
                path, {k: a for k, a in arrays.items() if k not in direct}, own, compressors
            )
        else:
            path.mkdir(parents=True)
            zarr_direct.write_file(path / "zarr.json", zarr_direct.group_json())
        made = {path}
        zarr_direct.write_arrays(
            path,
            [(key, t, arrays[key], chunk_rows(arrays[key])) for key, t in direct.items()],
            made,
        )


def codecs_of(
    columns: Mapping[str, Any], codecs: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, list[object]]:
    """Column key -> its field's own zarr codec (``loaders.format.codecs``), for the columns written
    here."""

    return {k: [zarr_codec(c, f"column {k!r}")] for k, c in (codecs or {}).items() if k in columns}


def _write_with_zarr(
    path: Path,
    arrays: Mapping[str, Any],
    own: Mapping[str, list[object]],
    compressors: list[object],
) -> None:
    """The shard's group, and these arrays written through zarr-python (the reference for
    zarr_direct)."""
    import zarr  # import weight: zarr

    group = zarr.open_group(zarr.storage.LocalStore(str(path)), mode="w-", zarr_format=3)
    for key, a in arrays.items():
        rows = chunk_rows(a)
        arr = group.create_array(
            key,
            shape=tuple(a.shape),
            dtype=a.dtype,
            chunks=(rows, *a.shape[1:]),
            compressors=own.get(key, compressors),
            fill_value=0,
            config={"write_empty_chunks": True},
        )  # skips a full compare per chunk
        if isinstance(a, np.ndarray):
            if a.size:
                arr[...] = a
            continue
        for lo in range(0, a.shape[0], rows):  # lazy: one chunk of rows in memory at a time
            arr[lo : lo + rows] = np.asarray(a[lo : lo + rows])
