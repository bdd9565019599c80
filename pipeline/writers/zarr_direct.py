"""A zarr v3 array's files written directly: its ``zarr.json`` serialised by zarr's own metadata
class, its chunks encoded by the numcodecs codec that zarr's codec wraps, each file written with
one plain write.

Why: zarr-python writes an array through its async store and codec pipeline (an event loop, a
thread hop per chunk and per file, futures): ~5 ms of CPU per array at 13 arrays a shard, about
as much as the Blosc compression of the shard's bytes (`python -m benchmarks.experiments.build.writer_ab`;
docs/benchmarks/ANALYSIS.md, "3 — build throughput"). The bytes must stay zarr's, so nothing here is a
second definition of the format:

* metadata: zarr-python writes a probe array of the same dtype, trailing shape and codecs into a
memory
  store; its ``zarr.json`` is the template, and each array's file is that template with its own
  shape and
  chunk shape, parsed and serialised again by ``ArrayV3Metadata`` (what zarr-python itself writes
  with);
* chunks: zarr-python pads an edge chunk with the fill value to the full chunk shape and encodes it
with
  the ``bytes`` codec (little-endian C order) then its compressors; here the same padded chunk goes
  through the same numcodecs codec (``blosc``, ``zstd``), built from the template's codec
  configuration;
* the probe's chunk files (a full and a padded edge chunk) and ``zarr.json`` must equal ours byte
for byte,
  once per signature per process; a signature that differs, or a codec not listed in ``ENCODERS``,
  gets
  ``None`` from `array_template` and the caller writes that array through zarr-python.
"""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.buffers import thread_scratch
from pipeline.writers.blosc_into import blosc_into

GROUP_JSON: bytes | None = (
    None  # an implicit group's zarr.json, as zarr-python writes it (see group_json)
)
_TEMPLATES: dict[tuple[Any, ...], ArrayTemplate | None] = {}
PAD = "pad"  # the thread's scratch buffer that edge chunks are padded in
_LOCK = threading.Lock()  # pack tasks on threads probe the same signatures at once
# bytes, or a view of a reused buffer valid until the encoder's next call in this thread
Encoder = Callable[[np.ndarray], Any]


def _blosc(conf: dict[str, Any]) -> Encoder:
    import numcodecs  # import weight: ~0.2 s, a no-change rebuild writes nothing

    shuffle = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[conf["shuffle"]]
    if conf.get("typesize") is not None:
        # into a reused buffer (pipeline.writers.blosc_into): numcodecs' own call, no fresh pages
        into = blosc_into(
            conf["cname"], conf["clevel"], shuffle, conf["blocksize"], conf["typesize"]
        )
        if into is not None:
            return into.encode
    codec = numcodecs.Blosc(
        cname=conf["cname"],
        clevel=conf["clevel"],
        shuffle=shuffle,
        blocksize=conf["blocksize"],
        typesize=conf["typesize"],
    )
    return codec.encode  # type: ignore[no-any-return]


def _zstd(conf: dict[str, Any]) -> Encoder:
    from numcodecs.zstd import Zstd  # import weight: as above

    return Zstd(level=conf["level"], checksum=conf.get("checksum", False)).encode  # type: ignore[no-any-return]


# zarr v3 codec name -> the numcodecs codec zarr-python's own codec calls (zarr.codecs.blosc /
# .zstd)
ENCODERS: dict[str, Callable[[dict[str, Any]], Encoder]] = {"blosc": _blosc, "zstd": _zstd}


class ArrayTemplate:
    """One signature's zarr.json template and chunk encoders (see the module docstring)."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta
        codecs = meta["codecs"]
        first = codecs[0]
        if (
            first["name"] != "bytes"
            or first.get("configuration", {}).get("endian", "little") != "little"
        ):
            raise ValueError(f"first codec {first!r} is not little-endian bytes")
        self.encoders = [ENCODERS[c["name"]](c.get("configuration", {})) for c in codecs[1:]]

    def metadata(self, shape: Sequence[int], chunks: Sequence[int]) -> bytes:
        from zarr.core.buffer import default_buffer_prototype  # import weight: zarr
        from zarr.core.metadata.v3 import ArrayV3Metadata  # import weight: zarr

        doc = copy.deepcopy(self.meta)
        doc["shape"] = list(shape)
        doc["chunk_grid"]["configuration"]["chunk_shape"] = list(chunks)
        return (
            ArrayV3Metadata.from_dict(doc)
            .to_buffer_dict(default_buffer_prototype())["zarr.json"]
            .to_bytes()
        )

    def encode(self, chunk: np.ndarray) -> bytes | memoryview:
        """The chunk's file bytes: valid until this template's next encode in this thread (an
        encoder may write into a reused buffer)."""
        out: Any = np.ascontiguousarray(chunk).view(np.uint8).reshape(-1)
        for enc in self.encoders:
            out = enc(out)
        return out if isinstance(out, bytes | memoryview) else memoryview(out).cast("B")


def _zarr_files(
    a: np.ndarray, chunks: tuple[int, ...], compressors: list[object]
) -> dict[str, bytes]:
    """Every file zarr-python writes for array ``a`` (as the shard writer calls it), from a memory
    store."""
    import zarr  # import weight: zarr ~0.3 s, a no-change rebuild writes nothing

    store = zarr.storage.MemoryStore()
    group = zarr.open_group(store, mode="w-", zarr_format=3)
    arr = group.create_array(
        "a",
        shape=a.shape,
        dtype=a.dtype,
        chunks=chunks,
        compressors=compressors,
        fill_value=0,
        config={"write_empty_chunks": True},
    )
    arr[...] = a
    return {k: v.to_bytes() for k, v in store._store_dict.items()}  # noqa: SLF001 (a test double of the store)


def group_json() -> bytes:
    """The zarr.json of a group with no attributes (the shard root and each implicit parent group)."""
    global GROUP_JSON
    if GROUP_JSON is None:
        from zarr.core.buffer import default_buffer_prototype  # import weight: zarr
        from zarr.core.group import GroupMetadata  # import weight: zarr

        GROUP_JSON = (
            GroupMetadata(zarr_format=3)
            .to_buffer_dict(default_buffer_prototype())["zarr.json"]
            .to_bytes()
        )
    return GROUP_JSON


def array_template(
    dtype: np.dtype, trailing: tuple[int, ...], compressors: list[object]
) -> ArrayTemplate | None:
    """The verified template of arrays of ``dtype`` with rows of shape ``trailing`` and these
    compressors, or None: zarr-python writes such arrays itself (an unknown codec, or bytes that
    would differ)."""
    if any(d <= 0 for d in trailing):
        return None
    try:
        conf = json.dumps([c.to_dict() for c in compressors], sort_keys=True)  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        return None
    key = (np.dtype(dtype).str, trailing, conf)
    with _LOCK:
        if key not in _TEMPLATES:
            _TEMPLATES[key] = _probe(np.dtype(dtype), trailing, compressors)
        return _TEMPLATES[key]


def _probe(
    dtype: np.dtype, trailing: tuple[int, ...], compressors: list[object]
) -> ArrayTemplate | None:
    """Write a 5-row probe (a full chunk of 3 rows, an edge chunk of 2 padded to 3) both ways;
    compare."""
    rng = np.random.default_rng(0)
    probe = (
        rng.integers(0, 2, (5, *trailing))
        if dtype.kind == "b"
        else rng.integers(0, 100, (5, *trailing))
    ).astype(dtype)
    chunks = (3, *trailing)
    try:
        theirs = _zarr_files(probe, chunks, compressors)
        template = ArrayTemplate(json.loads(theirs["a/zarr.json"]))
        ours = {
            "zarr.json": group_json(),
            **{f"a/{k}": v for k, v in array_files(template, probe, chunks[0])},
        }
    except (KeyError, ValueError, TypeError):
        return None
    return template if ours == theirs else None


def chunk_key(i: int, ndim: int) -> str:
    """zarr's default chunk key ("/" separator) of the i-th chunk along the first axis."""
    return "c/" + "/".join([str(i), *("0" * (ndim - 1))])


def array_files(t: ArrayTemplate, a: Any, rows: int) -> list[tuple[str, bytes]]:
    """(relative path, bytes) of every file of array ``a`` (an ndarray, or a lazy column sliced by
    rows) chunked by ``rows`` along the first axis: zarr.json, then its chunks, each padded with
    zeros (the fill value) to the full chunk shape as zarr-python stores an edge chunk. For a
    small array (one chunk)."""
    return [
        ("zarr.json", t.metadata(a.shape, (rows, *a.shape[1:]))),
        *((name, bytes(data)) for name, data in chunks(t, a, rows)),
    ]


def chunks(t: ArrayTemplate, a: Any, rows: int) -> Any:
    """Yield (relative path, encoded bytes) of each chunk; one chunk's rows in memory at a time.
    The bytes are valid until the next chunk (`ArrayTemplate.encode`)."""
    n = int(a.shape[0])
    if n == 0 or int(np.prod(a.shape, dtype=np.int64)) == 0:
        return
    for i, lo in enumerate(range(0, n, rows)):
        block = np.asarray(a[lo : lo + rows])
        if block.shape[0] < rows:
            pad = _pad_buffer((rows, *a.shape[1:]), block.dtype)
            pad[: block.shape[0]] = block
            pad[block.shape[0] :] = 0
            block = pad
        yield chunk_key(i, len(a.shape)), t.encode(block)


def _pad_buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A reused buffer of this shape and dtype (contents undefined) in the thread's scratch
    (`pipeline.buffers`: fresh pages cost a copy; a build drops it with the rest). Bytes viewed
    as the dtype: edge chunks of every array share it, and it only ever goes to Blosc."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return thread_scratch().get(PAD, np.uint8, nbytes).view(dtype).reshape(shape)


def write_file(path: Path, data: bytes | memoryview) -> None:
    """One file in one write (the shard folder is a temporary name until the writer's caller renames
    it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def write_arrays(
    root: Path, arrays: Sequence[tuple[str, ArrayTemplate, Any, int]], made: set[Path]
) -> None:
    """Arrays ``(key, template, array, chunk rows)`` of the group at ``root``, with the zarr.json
    of every parent group zarr-python would create (``made``: folders this shard already has).

    Chunks are written round-robin (chunk 0 of every array, then chunk 1, ...), not array after
    array: the same files, but columns sliced from one source together (a shard's `X/data` and
    `X/indices` from its spilled rows: one gather gives both) are asked for the same rows one
    after the other, so the source's last-slice cache serves the second. Written array after
    array, every chunk of a 2M-cell build's shards was gathered twice."""
    folders, encoded = [], []
    for key, t, a, rows in arrays:
        folder = root / key
        for parent in [*reversed(folder.relative_to(root).parents)][1:]:
            if root / parent not in made:
                (root / parent).mkdir(exist_ok=True)
                write_file(root / parent / "zarr.json", group_json())
                made.add(root / parent)
        folder.mkdir()
        write_file(folder / "zarr.json", t.metadata(a.shape, (rows, *a.shape[1:])))
        folders.append(folder)
        encoded.append(chunks(t, a, rows))
    live = list(zip(folders, encoded, strict=True))
    while live:  # chunk i of every array that has one, each written before the next is encoded
        for folder, gen in list(live):
            chunk = next(gen, None)
            if chunk is None:
                live.remove((folder, gen))
                continue
            path = folder / chunk[0]
            if path.parent not in made:
                path.parent.mkdir(parents=True, exist_ok=True)
                made.add(path.parent)
            write_file(path, chunk[1])
