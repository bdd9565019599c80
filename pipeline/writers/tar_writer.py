"""WebDataset-compatible tar shards: one uncompressed POSIX tar of plain ``.npy`` members per shard.

Why tar: a stock ``webdataset.WebDataset(url).decode()`` (and anything that streams tar, e.g.
from object stores over HTTP) can read these shards without shardsmith. Why blocks: one tar
member per cell would mean ~1 KB members with 1.5 KB of tar headers each; instead every
``block_records`` records form one WebDataset sample whose fields are that block's slice of every
record column (CSR/ragged pointers rebased to 0). The member layout (names, the ``_meta.json``
map, pointer groups) lives in ``loaders.format.tar_reader`` so that the reader and this writer share one
definition.

Compression: none. The manifest's codec applies to zarr only: WebDataset users expect plain
``.npy`` members they can ``np.load``, and a tar is read sequentially at disk speed anyway. A
field with its own codec (``loaders.format.codecs``, e.g. spike windows' ``shardsmith.spikebits``)
is the exception: each block's member is a 1-d uint8 ``.npy`` of the encoded bytes, and
``_meta.json`` ``codecs`` names the codec, the column's dtype and record shape
(``numcodecs.get_codec(codec).decode(member)`` gives the block's rows back).

Determinism: members are written in sorted name order (``_meta`` < ``b000000`` < ... <
``tables``) with mtime 0, uid/gid 0, empty user/group names and mode 0644, so equal columns give
byte-identical files.

Streaming: each member goes to the file as its ``.npy`` header and then the block's slice itself
(`TarStream`: the stdlib's header encoding and padding, nothing copied), and a lazy column (a spilled
shard's rows, `pipeline.modalities.perturbation.spill.LazyColumn`) is fetched one block at a time.
Through ``tarfile`` every byte was copied three times into fresh memory (the whole shard first,
then each member's ``.npy`` bytes twice): a 2M-cell build faulted in 2.4 million pages and peaked
at twice the zarr build's memory (docs/PIPELINE.md, "Tar shards stream").
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from loaders import format as fmt
from loaders.format.codecs import get_field_codec
from loaders.format.tar_reader import (
    TAR_META_KEY,
    TAR_TABLES_KEY,
    pointer_groups,
    tar_block_key,
    tar_field_names,
)
from pipeline.writers.base import Codec, ShardWriter, contiguous_or_lazy, register_writer

BLOCK_RECORDS = (
    4096  # ~4-8 MB blocks for expression shards: few members, and a block decodes in one go
)


@register_writer
class TarShardWriter(ShardWriter):
    encoding = "tar"
    suffix = ".tar"

    def __init__(self, codec: Codec, block_records: int = BLOCK_RECORDS) -> None:
        super().__init__(codec)
        if block_records < 1:
            raise ValueError(f"block_records must be >= 1, got {block_records}")
        self.block_records = block_records

    def write(
        self,
        path: Path,
        columns: Mapping[str, np.ndarray],
        tables: Collection[str] = (),
        codecs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:

        cols = {k: contiguous_or_lazy(v) for k, v in columns.items()}  # np.save follows order
        for k, a in cols.items():
            if a.dtype.hasobject or a.ndim == 0:
                raise ValueError(
                    f"column {k!r}: tar shards hold numeric arrays of rank >= 1, got {a.dtype}{a.shape}"
                )
        table_keys = set(tables)
        tables = sorted(k for k in cols if k in table_keys)
        records = sorted(k for k in cols if k not in table_keys)
        groups = pointer_groups(records)
        n = _record_count(cols, records, groups)
        blocks = max(1, -(-n // self.block_records)) if records else 0
        names = tar_field_names(cols)
        meta = {
            "format": fmt.FORMAT_NAME,
            "version": fmt.SHARD_VERSION,
            "encoding": self.encoding,
            "n_records": n,
            "blocks": blocks,
            "block_records": self.block_records,
            "columns": {names[k]: k for k in cols},
            "tables": tables,
            "compression": "none",
        }
        own = {
            k: get_field_codec(c, f"column {k!r}")
            for k, c in (codecs or {}).items()
            if k in records
        }
        if own:
            meta["codecs"] = {
                k: {
                    "codec": c.get_config(),
                    "dtype": str(cols[k].dtype),
                    "shape": list(cols[k].shape[1:]),
                }
                for k, c in own.items()
            }
        Path(path).parent.mkdir(parents=True, exist_ok=True)  # as zarr's LocalStore does
        payload_of = {p: k for k, ps in groups.items() for p in ps}
        with TarStream(path) as tar:
            meta_json = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
            tar.add(f"{TAR_META_KEY}.json", [meta_json])
            for b in range(blocks):
                key = tar_block_key(b, blocks)
                start, stop = b * self.block_records, min(n, (b + 1) * self.block_records)
                for name, k in sorted((names[k], k) for k in records):
                    a = _block_column(cols, k, groups, payload_of, start, stop)
                    if k in own:
                        a = np.frombuffer(own[k].encode(np.asarray(a)), np.uint8)
                    tar.add(f"{key}.{name}.npy", _npy_parts(a))
            for name, k in sorted((names[k], k) for k in tables):
                tar.add(f"{TAR_TABLES_KEY}.{name}.npy", _npy_parts(np.asarray(cols[k])))


def _record_count(
    cols: Mapping[str, np.ndarray], records: list[str], groups: dict[str, list[str]]
) -> int:
    """Every record column must agree on n, and pointers must cover their payloads exactly (else a
    block cut would silently drop or duplicate entries)."""
    payloads = {p for ps in groups.values() for p in ps}
    counts: dict[str, int] = {}
    for k in records:
        a = cols[k]
        if k in groups:
            if a.ndim != 1 or a.size == 0 or a[0] != 0:
                raise ValueError(f"column {k!r}: a pointer array is 1-d and starts at 0")
            for p in groups[k]:
                if cols[p].shape[0] != int(a[-1]):
                    raise ValueError(
                        f"column {p!r} has {cols[p].shape[0]} entries, {k!r} ends at {a[-1]}"
                    )
            counts[k] = a.size - 1
        elif k not in payloads:
            counts[k] = a.shape[0]
    if len(set(counts.values())) > 1:
        raise ValueError(f"record columns disagree on the number of records: {counts}")
    return next(iter(counts.values()), 0)


def _block_column(
    cols: Mapping[str, Any],
    k: str,
    groups: Mapping[str, list[str]],
    payload_of: Mapping[str, str],
    start: int,
    stop: int,
) -> np.ndarray:
    """Records [start, stop) of column ``k``: a pointer rebased to 0, a payload's entries between
    its pointer's bounds, any other column's rows. A lazy column's slice is a view of its reused
    buffers: write it before the next slice."""
    if k in groups:
        ptr = cols[k][start : stop + 1]
        return ptr - ptr[0]
    if k in payload_of:
        ptr = cols[payload_of[k]]
        return np.ascontiguousarray(cols[k][int(ptr[start]) : int(ptr[stop])])
    return np.ascontiguousarray(cols[k][start:stop])


def _npy_parts(a: np.ndarray) -> list[Any]:
    """A ``.npy`` file as (header, the array's own bytes): what ``np.save`` writes, uncopied."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(a))
    return [head.getvalue(), a.reshape(-1).view(np.uint8)]  # C-contiguous: its bytes, in order


class TarStream:
    """A POSIX (pax) tar written member by member from buffers, as ``tarfile`` writes it (its own
    header encoding, 512-byte padding and end blocks), without copying them: the file is created
    exclusively (mode ``"x"``, as ``tarfile.open(mode="x:")``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.fh: BinaryIO | None = None

    def __enter__(self) -> TarStream:
        self.fh = open(self.path, "xb")  # noqa: SIM115  (closed by __exit__)
        return self

    def add(self, name: str, parts: list[Any]) -> None:
        """One regular file member: ``parts`` (bytes or 1-d uint8 arrays) back to back."""
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = sum(len(x) for x in parts), 0, 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.type = tarfile.REGTYPE
        self._write(info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"))
        for x in parts:
            self._write(x)
        self._pad(tarfile.BLOCKSIZE)

    def _write(self, data: Any) -> None:
        assert self.fh is not None
        self.offset += self.fh.write(data)

    def _pad(self, unit: int) -> None:
        if self.offset % unit:
            self._write(tarfile.NUL * (unit - self.offset % unit))

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        assert self.fh is not None
        try:
            if exc_type is None:  # tarfile's end: two zero blocks, then up to a whole record
                self._write(tarfile.NUL * (2 * tarfile.BLOCKSIZE))
                self._pad(tarfile.RECORDSIZE)
        finally:
            self.fh.close()
