"""The on-disk contract between the pipeline (writer) and the loader (reader).

This is the only module that knows key names inside a shard and the layout of ``index.json``.
A dataset is a folder ``OUT/`` holding ``index.json`` (the commit point) and ``shards/*``.
Every shard stores the same *logical columns* whatever its encoding (zarr store or tar):

* record fields, one entry per record, of three kinds:
  ``dense``  -> one array ``[n, *shape]``;
  ``csr``    -> ``<name>/indptr [n+1]``, ``<name>/indices [nnz]``, ``<name>/data [nnz]`` (rows of ``shape[0]`` columns);
  ``ragged`` -> ``<name>/offsets [n+1]``, ``<name>/values [total, *shape]`` (a variable-length list per record);
* shard tables that refer to records by local row id (``pairs [P,2]``, ``sentences/pert|ctrl [S,L]``).

Adding a modality adds fields of these kinds, never a new format version.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_NAME = "shardsmith"
FORMAT_VERSION = 1
INDEX_FILE = "index.json"
SHARDS_DIR = "shards"
ENCODINGS = ("zarr", "tar")
KINDS = ("dense", "csr", "ragged")
SPLITS = ("train", "val", "test")

# Standard column names (record fields and shard tables).
X = "X"
SAMPLE_ID = "sample_id"  # int64: position of the record in the concatenation of the manifest's sources
PRIMARY = "primary"  # bool: False for a control duplicated into this shard for pairing (not counted in epochs)
COND_ID = "cond_id"  # int32: row of the condition table
OBS_PREFIX = "obs/"  # obs/<field>: int32 codes into vocabularies[<field>]
OBSM_PREFIX = "obsm/"  # obsm/<key>: dense float32 embeddings
PAIRS = "pairs"  # int32 [P, 2]: (control row, perturbed row), local to the shard
SENTENCES_PERT = "sentences/pert"  # int32 [S, L]: local rows of one (cell_type, perturbation, batch) group
SENTENCES_CTRL = "sentences/ctrl"  # int32 [S, L]: matched control rows
TABLES = (PAIRS, SENTENCES_PERT, SENTENCES_CTRL)
VOXELS = "voxels"  # spike: uint8 [bins, H, W] per record (dense)
COORDS = "coords"  # CT: ragged uint16 [N, 3] per volume
VALUES = "values"  # CT: ragged float32 [N] per volume


class FormatError(Exception):
    """A dataset or shard does not follow this contract (missing, corrupt, wrong version)."""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FormatError(f"field {self.name!r}: unknown kind {self.kind!r} (expected one of {KINDS})")
        if self.kind == "csr" and len(self.shape) != 1:
            raise FormatError(f"field {self.name!r}: a csr field has shape (n_cols,)")

    def keys(self) -> tuple[str, ...]:
        if self.kind == "dense":
            return (self.name,)
        if self.kind == "csr":
            return (f"{self.name}/indptr", f"{self.name}/indices", f"{self.name}/data")
        return (f"{self.name}/offsets", f"{self.name}/values")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> FieldSpec:
        return FieldSpec(str(d["name"]), str(d["kind"]), str(d["dtype"]), tuple(int(s) for s in d["shape"]))


def shard_keys(fields: Iterable[FieldSpec], tables: Iterable[str] = ()) -> list[str]:
    """Every flat key a shard with these fields and tables holds, in a fixed order."""
    keys = [k for f in fields for k in f.keys()]
    return keys + [t for t in TABLES if t in set(tables)]


def validate_columns(columns: Mapping[str, np.ndarray], fields: Iterable[FieldSpec], name: str = "shard") -> int:
    """Check shapes, dtypes and CSR/ragged consistency; return the number of records."""
    n: int | None = None

    def count(k: str, m: int) -> None:
        nonlocal n
        if n is None:
            n = m
        elif n != m:
            raise FormatError(f"{name}: column {k!r} has {m} records, expected {n}")

    for f in fields:
        for k in f.keys():
            if k not in columns:
                raise FormatError(f"{name}: missing column {k!r}")
        if f.kind == "dense":
            a = columns[f.name]
            if tuple(a.shape[1:]) != f.shape or a.dtype != np.dtype(f.dtype):
                raise FormatError(f"{name}: {f.name!r} is {a.dtype}{list(a.shape)}, schema says {f.dtype}[n,{f.shape}]")
            count(f.name, a.shape[0])
            continue
        ptr_key, payload_key = (f.keys()[0], f.keys()[-1])
        ptr = columns[ptr_key]
        if ptr.ndim != 1 or ptr.size == 0 or ptr[0] != 0 or np.any(np.diff(ptr) < 0):
            raise FormatError(f"{name}: {ptr_key!r} is not a monotonic pointer array starting at 0")
        payload = columns[payload_key]
        if int(ptr[-1]) != payload.shape[0] or payload.dtype != np.dtype(f.dtype):
            raise FormatError(f"{name}: {payload_key!r} has {payload.shape[0]} {payload.dtype} entries, pointers say {ptr[-1]} {f.dtype}")
        if f.kind == "csr":
            idx = columns[f"{f.name}/indices"]
            if idx.shape != payload.shape or (idx.size and (idx.min() < 0 or idx.max() >= f.shape[0])):
                raise FormatError(f"{name}: {f.name}/indices out of range [0, {f.shape[0]})")
        elif tuple(payload.shape[1:]) != f.shape:
            raise FormatError(f"{name}: {payload_key!r} inner shape {payload.shape[1:]} != {f.shape}")
        count(ptr_key, ptr.size - 1)
    n = 0 if n is None else n
    for t in TABLES:
        if t in columns:
            a = columns[t]
            if a.size and (a.min() < 0 or a.max() >= n):
                raise FormatError(f"{name}: table {t!r} refers to rows outside [0, {n})")
    return n


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the index describes it."""

    file: str
    split: str
    records: int  # rows stored (duplicated controls included)
    primary: int  # rows counted in an epoch of sample="cells"
    pairs: int
    sentences: int
    bytes: int  # on disk
    raw_bytes: int  # uncompressed payload
    sha256: str
    plan_key: str
    source: int = -1  # manifest source ordinal whose rows it holds (-1 if mixed or not applicable)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ShardEntry:
        return ShardEntry(**{k: d[k] for k in ShardEntry.__dataclass_fields__ if k in d})


@dataclass
class Index:
    """`index.json`, parsed and checked. Per-shard numbers are numpy arrays (cheap to copy to workers)."""

    root: Path
    name: str
    kind: str
    encoding: str
    fields: list[FieldSpec]
    tables: list[str]
    shards: list[ShardEntry]
    vocabularies: dict[str, list[str]] = field(default_factory=dict)
    conditions: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def shards_of(self, split: str | None) -> list[ShardEntry]:
        return [s for s in self.shards if split is None or s.split == split]

    def shard_path(self, entry: ShardEntry) -> Path:
        return self.root / SHARDS_DIR / entry.file


def index_path(root: str | Path) -> Path:
    return Path(root) / INDEX_FILE


def read_index(root: str | Path) -> Index:
    path = index_path(root)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path}: no index.json (not a shardsmith dataset, or never committed)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: index.json is not valid JSON ({e})") from None
    if raw.get("format") != FORMAT_NAME:
        raise FormatError(f"{path}: format is {raw.get('format')!r}, expected {FORMAT_NAME!r}")
    if raw.get("version") != FORMAT_VERSION:
        raise FormatError(f"{path}: format version {raw.get('version')!r}; this reader understands {FORMAT_VERSION}")
    try:
        encoding = raw["encoding"]
        if encoding not in ENCODINGS:
            raise FormatError(f"{path}: unknown shard encoding {encoding!r}")
        return Index(
            root=Path(root),
            name=raw["name"],
            kind=raw["kind"],
            encoding=encoding,
            fields=[FieldSpec.from_json(f) for f in raw["fields"]],
            tables=list(raw.get("tables", [])),
            shards=[ShardEntry.from_json(s) for s in raw["shards"]],
            vocabularies={k: list(v) for k, v in raw.get("vocabularies", {}).items()},
            conditions=raw.get("conditions"),
            raw=raw,
        )
    except KeyError as e:
        raise FormatError(f"{path}: missing key {e}") from None


def index_document(*, name: str, kind: str, encoding: str, fields: Iterable[FieldSpec], tables: Iterable[str],
                   shards: Iterable[ShardEntry], **extra: Any) -> dict[str, Any]:
    """The JSON document for index.json (keys sorted on write, so equal inputs give equal bytes)."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "name": name,
        "kind": kind,
        "encoding": encoding,
        "fields": [f.to_json() for f in fields],
        "tables": list(tables),
        "shards": [asdict(s) for s in shards],
        **extra,
    }


def write_index(root: str | Path, document: Mapping[str, Any]) -> Path:
    """Atomically replace index.json: the moment a new dataset becomes visible to readers."""
    data = json.dumps(document, indent=1, sort_keys=True).encode() + b"\n"
    path = index_path(root)
    atomic_write_bytes(path, data)
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def content_hash(path: str | Path) -> str:
    """sha256 of a file, or of a folder as the sorted (relative path, bytes) of every file in it."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    if not files and not path.exists():
        raise FormatError(f"{path}: missing")
    for p in files:
        if p != path:
            h.update(p.relative_to(path).as_posix().encode() + b"\0")
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def stored_bytes(path: str | Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
