"""The tar shard encoding (WebDataset-compatible), read side: the member layout the writer
(``pipeline/writers/tar_writer.py``) shares, and the reader that rejoins a shard's blocks into its
logical columns.

Why a module of its own: a tar shard is parsed member by member with the stdlib (one sequential
pass, each ``.npy`` header checked and its payload viewed in place), which shares nothing with the
zarr reader beyond the column keys; ``loaders.format.readers`` registers :func:`read_tar_shard` as the
``tar`` reader beside zarr's. Key names still come from ``loaders.format``. The one lock every
``.npy`` header parse goes through (:func:`read_npy_header`) is here too, with its main user; the
CT pipeline's ``.npy`` source takes it from here.
"""

from __future__ import annotations

import io
import json
import math
import re
import tarfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loaders.format import FORMAT_NAME, SHARD_VERSION, FormatError
from loaders.format.codecs import get_field_codec
from loaders.format.forksafe import fork_safe_lock

# -- tar (WebDataset-compatible) -------------------------------------------------------------------
# Layout shared with pipeline/writers/tar_writer.py (the writer imports these names, so both sides
# agree): _meta.json                      the shard's own map: member field -> column key, counts,
# block size
#   b000000.<field>.npy ...         block 0: rows [0, block_records) of every record column
#   b000001.<field>.npy ...         (CSR/ragged pointers rebased to 0 in every block)
# tables.<field>.npy              shard tables (pairs, sentences/*): they refer to whole-shard rows
# WebDataset splits a member name at the first dot: key "b000000", field "x_indptr.npy". Names sort
# in this order (ASCII "_" < "b" < "t"), so sorted members put the map first and a reader needs one
# pass.
TAR_META_KEY = "_meta"
TAR_TABLES_KEY = "tables"
TAR_BLOCK_PREFIX = "b"
POINTER_SUFFIXES = ("/indptr", "/offsets")
_NPY_HEAD = 1 << 16  # numpy refuses .npy headers over 10000 bytes anyway
_MEMBER = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext: key, field


def tar_field_names(keys: Iterable[str]) -> dict[str, str]:
    """Column key -> member field token: lower case (WebDataset lower-cases extensions), no "/" or
    ".", unique (a clash gets a numeric suffix, decided in sorted key order so it is
    deterministic)."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for key in sorted(keys):
        base = re.sub(r"[^a-z0-9_-]", "_", key.lower()).strip("_") or "col"
        name, i = base, 2
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        names[key] = name
        taken.add(name)
    return names


def pointer_groups(keys: Iterable[str]) -> dict[str, list[str]]:
    """Pointer key -> its payload keys (same prefix): the columns that must be cut and rejoined
    together."""
    keys = list(keys)
    groups = {}
    for k in keys:
        if k.endswith(POINTER_SUFFIXES):
            prefix = k.rsplit("/", 1)[0]
            groups[k] = sorted(
                p for p in keys if p != k and p.rsplit("/", 1)[0] == prefix and "/" in p
            )
    return groups


def tar_block_key(block: int, blocks: int) -> str:
    """Fixed width per shard so that name order is block order."""
    return f"{TAR_BLOCK_PREFIX}{block:0{max(6, len(str(max(blocks - 1, 0))))}d}"


def read_tar_shard(
    path: Path, keys: Sequence[str], data: bytes | None = None
) -> dict[str, np.ndarray]:
    """One sequential pass with the stdlib; members of columns not asked for are skipped, not read.
    ``data``: the file's bytes, read (and checked) already by ``loaders.format.integrity``."""
    path = Path(path)
    try:
        with (
            tarfile.open(path, mode="r:")
            if data is None
            else tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf
        ):
            return _read_tar(tf, path, keys, None if data is None else memoryview(data))
    except FileNotFoundError:
        raise FormatError(f"{path}: shard is missing") from None
    except FormatError:
        raise
    except (
        tarfile.TarError,
        EOFError,
        OSError,
    ) as e:  # bad header, truncated data, not a tar at all
        raise FormatError(
            f"{path}: corrupt or truncated tar shard ({type(e).__name__}: {e})"
        ) from e


def _read_tar(
    tf: tarfile.TarFile, path: Path, keys: Sequence[str], buffer: memoryview | None = None
) -> dict[str, np.ndarray]:
    """``buffer``: the whole file's bytes (``tf`` reads them), whose members are viewed in place."""
    meta: dict[str, Any] | None = None
    field_key: dict[str, str] = {}
    tables: set[str] = set()
    wanted = set(keys)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in wanted}
    blocks_seen = 0
    names: set[str] = set()
    for info in tf:
        m = _MEMBER.match(info.name)
        if not info.isreg() or m is None or info.name in names:
            raise FormatError(
                f"{path}: unexpected {'duplicate ' * (info.name in names)}tar member {info.name!r}"
            )
        names.add(info.name)
        sample, fld = m.group(1), m.group(2)
        if meta is None:
            if (sample, fld) != (TAR_META_KEY, "json"):
                raise FormatError(
                    f"{path}: first member is {info.name!r}, expected {TAR_META_KEY}.json"
                )
            meta = _tar_meta(tf, info, path)
            field_key = {f: str(k) for f, k in meta["columns"].items()}
            tables = set(meta["tables"])
            codecs = _tar_codecs(meta, path)
            missing = sorted(wanted - set(field_key.values()))
            if missing:
                raise FormatError(f"{path}: shard has no column {missing[0]!r}")
            continue
        if not fld.endswith(".npy") or fld[:-4] not in field_key:
            raise FormatError(
                f"{path}: unexpected tar member {info.name!r} (only .npy columns of {TAR_META_KEY})"
            )
        key = field_key[fld[:-4]]
        if (sample == TAR_TABLES_KEY) != (key in tables):
            raise FormatError(
                f"{path}: unexpected tar member {info.name!r} (tables go in {TAR_TABLES_KEY}.*)"
            )
        if sample.startswith(TAR_BLOCK_PREFIX):
            block = sample[len(TAR_BLOCK_PREFIX) :]
            if not block.isdigit() or int(block) not in (blocks_seen - 1, blocks_seen):
                raise FormatError(f"{path}: tar member {info.name!r} is out of order")
            blocks_seen = int(block) + 1
        elif sample != TAR_TABLES_KEY:
            raise FormatError(f"{path}: unexpected tar member {info.name!r}")
        if key in wanted:
            a = _npy(tf, info, path, buffer)
            parts[key].append(codecs[key](a, info.name) if key in codecs else a)
    if meta is None:
        raise FormatError(f"{path}: empty tar shard (no {TAR_META_KEY}.json)")
    return _join_blocks(path, meta, parts, blocks_seen)


def _tar_meta(tf: tarfile.TarFile, info: tarfile.TarInfo, path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(_member_bytes(tf, info))
        ok = (meta.get("format"), meta.get("version")) == (FORMAT_NAME, SHARD_VERSION)
        if ok and isinstance(meta.get("columns"), dict) and isinstance(meta.get("tables"), list):
            int(meta["blocks"]), int(meta["n_records"])
            return dict(meta)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    raise FormatError(f"{path}: {info.name} is not a {FORMAT_NAME} v{SHARD_VERSION} tar map")


def _tar_codecs(
    meta: dict[str, Any], path: Path
) -> dict[str, Callable[[np.ndarray, str], np.ndarray]]:
    """Column key -> a decoder of its members, for columns stored with their field's own codec."""

    out = {}
    for key, spec in (meta.get("codecs") or {}).items():
        try:
            codec = get_field_codec(spec["codec"], f"{path}: {TAR_META_KEY}.json column {key!r}")
            dtype, shape = np.dtype(spec["dtype"]), tuple(int(s) for s in spec["shape"])
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(
                f"{path}: {TAR_META_KEY}.json codecs[{key!r}] is malformed ({e})"
            ) from None
        out[str(key)] = _decoder(codec, dtype, shape, path)
    return out


def _decoder(
    codec: Any, dtype: np.dtype, shape: tuple[int, ...], path: Path
) -> Callable[[np.ndarray, str], np.ndarray]:
    def decode(a: np.ndarray, member: str) -> np.ndarray:
        try:
            return np.asarray(codec.decode(a)).reshape(-1).view(dtype).reshape(-1, *shape)
        except Exception as e:  # a corrupt stream: name the shard and member
            raise FormatError(
                f"{path}: member {member!r} does not decode ({type(e).__name__}: {e})"
            ) from None

    return decode


def _member_bytes(
    tf: tarfile.TarFile, info: tarfile.TarInfo, buffer: memoryview | None = None
) -> bytearray | memoryview:
    """The member's bytes: a slice of ``buffer`` (the whole file's bytes) if given, else one readinto
    (a bytearray, so arrays viewing it are writable, with no copy)."""
    if info.issparse():
        raise EOFError(f"member {info.name!r} is a sparse file")
    if buffer is not None:
        if info.offset_data + info.size > len(buffer):
            raise EOFError(f"member {info.name!r} truncated")
        return buffer[info.offset_data : info.offset_data + info.size]
    data = bytearray(info.size)
    tf.fileobj.seek(info.offset_data)
    if tf.fileobj.readinto(data) != info.size:
        raise EOFError(f"member {info.name!r} truncated")
    return data


NPY_HEADER_LOCK = fork_safe_lock()  # a forked worker gets it unlocked (loaders/format/forksafe.py)


def read_npy_header(fh: Any, version: tuple[int, int]) -> tuple[tuple[int, ...], bool, np.dtype]:
    """numpy parses a .npy header with ``ast.literal_eval``; CPython 3.11 can fail that with
    ``SystemError: AST constructor recursion depth mismatch`` when several threads parse at once
    (seen in the loader's tar reads), so every header parse goes through one lock (a few
    microseconds per member)."""
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    with NPY_HEADER_LOCK:
        return read(fh)


def _npy(
    tf: tarfile.TarFile, info: tarfile.TarInfo, path: Path, buffer: memoryview | None = None
) -> np.ndarray:
    """Parse the .npy header with numpy and view the payload in place: np.load(BytesIO) copies the
    data twice more (halving the read speed) and would also open a zip as an .npz. Object arrays
    (pickles) are refused. With ``buffer`` (the file's bytes, already read and checked) the member
    is a view of them: no copy (read-only arrays; the window decode copies them into its own)."""
    data = _member_bytes(tf, info, buffer)  # a short read is truncation, reported by read_tar_shard
    try:
        head = io.BytesIO(memoryview(data)[:_NPY_HEAD])
        version = np.lib.format.read_magic(head)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"unsupported .npy version {version}")
        shape, fortran, dtype = read_npy_header(head, version)
        if dtype.hasobject:
            raise ValueError("object arrays (pickled data) are refused")
        count = math.prod(shape)
        if count * dtype.itemsize != len(data) - head.tell():
            raise ValueError(f"{len(data) - head.tell()} payload bytes for {dtype}{list(shape)}")
        a = np.frombuffer(data, dtype=dtype, count=count, offset=head.tell())
    except (
        ValueError,
        OSError,
        EOFError,
    ) as e:  # bad magic or header, pickled objects, short payload
        raise FormatError(f"{path}: member {info.name!r} is not a valid .npy ({e})") from None
    return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


def _join_blocks(
    path: Path, meta: dict[str, Any], parts: dict[str, list[np.ndarray]], blocks_seen: int
) -> dict[str, np.ndarray]:
    """Rejoin per-block slices; a short member list means a truncated tar (tarfile stops at a bad
    header)."""
    blocks, n = int(meta["blocks"]), int(meta["n_records"])
    tables = set(meta["tables"])
    groups = pointer_groups(meta["columns"].values())
    payloads = {p: ptr for ptr, ps in groups.items() for p in ps}
    out: dict[str, np.ndarray] = {}
    for key, ps in parts.items():
        expected = 1 if key in tables else blocks
        if len(ps) != expected or (key not in tables and blocks_seen != blocks):
            raise FormatError(
                f"{path}: truncated tar shard ({key!r}: {len(ps)} of {expected} members)"
            )
        if key in tables:
            out[key] = ps[0]
            continue
        if key in groups:
            out[key] = _join_pointers(path, key, ps)
            rows = out[key].size - 1
        else:
            out[key] = ps[0] if len(ps) == 1 else np.concatenate(ps)
            rows = out[key].shape[0] if out[key].ndim else -1
        if key not in payloads and rows != n:
            raise FormatError(f"{path}: {key!r} has {rows} records, {TAR_META_KEY}.json says {n}")
    for key, ptr in payloads.items():
        if key in out and ptr in out and out[key].shape[:1] != (int(out[ptr][-1]),):
            raise FormatError(
                f"{path}: {key!r} has {out[key].shape[:1]} entries, {ptr!r} says {out[ptr][-1]}"
            )
    return out


def _join_pointers(path: Path, key: str, ps: list[np.ndarray]) -> np.ndarray:
    for p in ps:
        if p.ndim != 1 or p.size == 0 or p[0] != 0:
            raise FormatError(f"{path}: {key!r} block pointers do not start at 0")
    if len(ps) == 1:
        return ps[0]
    out = np.empty(1 + sum(p.size - 1 for p in ps), dtype=ps[0].dtype)
    out[0], at, base = 0, 1, 0
    for p in ps:
        np.add(p[1:], base, out=out[at : at + p.size - 1])
        at, base = at + p.size - 1, base + int(p[-1])
    return out
