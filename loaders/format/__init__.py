"""The on-disk contract between the pipeline (writer) and the loader (reader).

This is the only module that knows key names inside a shard and the layout of ``index.json`` (the
value types the index is made of, ``FieldSpec``, ``ShardEntry`` and ``ConditionsRef``, live in
``loaders.format.values`` and are re-exported here; what a reader does with the index's digest is
``loaders.format.index_check``). A dataset is a folder ``OUT/`` holding ``index.json`` (the commit point)
and ``shards/*``. Every shard stores the same *logical columns* whatever its encoding (zarr store
or tar):

* record fields, one entry per record, of three kinds:
  ``dense``  -> one array ``[n, *shape]``;
  ``csr``    -> ``<name>/indptr [n+1]``, ``<name>/indices [nnz]``, ``<name>/data [nnz]`` (rows of
  ``shape[0]`` columns);
  ``ragged`` -> ``<name>/offsets [n+1]``, ``<name>/values [total, *shape]`` (a variable-length list
  per record);
* shard tables that refer to records by local row id, ``[T, k]`` int32 (``pairs [P,2]``,
``sentences/pert|ctrl
  [S,L]``, spike ``clips [C,L]``); which tables a dataset has is listed in ``index.json``.

Adding a modality adds fields of these layouts and tables, never a new format version. Two
versions exist: ``SHARD_VERSION`` (the layout inside a shard) and ``INDEX_VERSION`` (index.json).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loaders.format.codecs import get_field_codec
from loaders.format.errors import FormatError  # noqa: F401 (part of this contract)
from loaders.format.files import atomic_write_bytes, content_hash, stored_bytes  # noqa: F401 (part of this contract)
from loaders.format.values import (  # noqa: F401 (the value types of this contract: fmt.FieldSpec, ...)
    LAYOUTS,
    ConditionsRef,
    FieldSpec,
    ShardEntry,
    column_codecs,
    csr_keys,
    ragged_keys,
    shard_keys,
)
from loaders.plugins import (
    check_plugins_allowed,
    format_keys,
    load_loader_modalities,
    load_plugin,
)
from loaders.plugins.registry import Registry

FORMAT_NAME = "shardsmith"
# index version -> the upgrade of that version's document to the current layout. An old version
# holds one modality's names (version 1 predates kinds), so that modality registers its upgrade.
INDEX_UPGRADES: Registry[Callable[[Mapping[str, Any]], dict[str, Any]]] = Registry(
    "index upgrade from version", discover=load_loader_modalities, error=FormatError
)
SHARD_VERSION = (
    1  # the layout inside a shard (tar ``_meta.json``, zarr arrays); part of every plan key
)
# the layout of index.json. 5: the digest covers ``plugins`` (the modules a reader imports), and
# every key of DIGEST_KEYS must be in it. 4: content digests name their algorithm (shards, condition table,
# sources: "digest": "xxh3_128:<hex>", loaders.format.digests); 3: fields may name a codec; 2: kinds.
# Every older version is still read (1 converted by ``read_index``; 2-3 store bare sha256 digests)
INDEX_VERSION = 5
FULL_DIGEST_INDEX_VERSION = 5  # the first version whose digest must cover every DIGEST_KEYS
SEALED_INDEX_VERSION = 4  # from this version on, an index without a digest is refused
CODEC_INDEX_VERSION = 3  # the first version whose fields may name their own codec
PLAIN_INDEX_VERSION = INDEX_VERSION  # was 2 (no field codec) before version 4; kept for callers
INDEX_FILE = "index.json"
SHARDS_DIR = "shards"
ENCODINGS = ("zarr", "tar")
SPLITS = ("train", "val", "test")

# Column names every kind may use.
SAMPLE_ID = (
    "sample_id"  # int64: position of the record in the concatenation of the manifest's sources
)
# bool: False for a record duplicated into this shard (e.g. a control for pairing): not
PRIMARY = "primary"
# counted in epochs; a dataset without this field counts every record as primary A kind's own column
# and table names are declared by its modality (its loader package's ``FORMAT_KEYS``, e.g. ``X``,
# ``PAIRS``); this module answers them by name too (``fmt.X``: see ``__getattr__`` below). The
# condition table (``Index.conditions``) is the format's:
CONDITION_VECTORS = "vectors"  # the condition table file: float32 [C, D]
CONDITION_CODES = "codes"  # and the obs codes each condition row stands for


@dataclass(frozen=True)
class Generation:
    """A committed generation of a dataset, as the next one's index remembers it
    (``Index.previous``): its number, the sha256 of its index.json bytes, and the files it named
    (shard names inside ``shards/``, the condition table beside index.json). A rebuild keeps
    these files, so a reader that opened that index keeps working until the generation after next
    is committed."""

    generation: int
    index_sha256: str
    shards: list[str]
    conditions: str | None = None

    def files(self) -> list[str]:
        """The files it names, relative to the dataset folder."""
        return [f"{SHARDS_DIR}/{s}" for s in self.shards] + (
            [self.conditions] if self.conditions else []
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Generation:
        cond = d.get("conditions")
        return Generation(
            int(d["generation"]),
            str(d["index_sha256"]),
            [str(s) for s in d["shards"]],
            None if cond is None else str(cond),
        )


@dataclass
class Index:
    """`index.json`, parsed and checked: the typed form of everything the format defines.

    ``sections`` holds each kind's own settings (``sections[kind]``: e.g. pairing and split
    settings for perturbation, resolution and packing for spike); the format stores them, their
    kind defines them. ``stats`` are the build's counts (records dropped and why, fallbacks
    taken): reported, never relied on for reading."""

    root: Path
    name: str
    kind: str  # the dataset kind (pipeline.kinds registry)
    encoding: str
    fields: list[FieldSpec]
    tables: list[str]
    shards: list[ShardEntry]
    samples: list[str] = field(default_factory=list)  # sample types every shard counts units for
    vocabularies: dict[str, list[str]] = field(default_factory=dict)
    obs_fields: list[str] = field(default_factory=list)  # obs/<f> fields in condition-vector order
    control_labels: list[str] = field(default_factory=list)
    conditions: ConditionsRef | None = None
    codec: dict[str, Any] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(
        default_factory=list
    )  # fingerprints: path, size, mtime_ns, digest (sha256 before version 4), ...
    stats: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)
    primary_records: int | None = (
        None  # records the plan placed (each primary exactly once), for verify
    )
    # Generations (docs/FORMAT.md, "Generations"): 1 for a first build, +1 per commit into the same
    # folder; 0 in an index written before generations existed. ``previous``: the generation this
    # one replaced, whose files are kept until the next commit. ``retired``: files (relative to the
    # folder) this commit deleted, or whose deletion a later build or `shardsmith gc` finishes if it
    # was interrupted.
    generation: int = 0
    previous: Generation | None = None
    retired: list[str] = field(default_factory=list)
    # read-side plug-in modules (the manifest's ``[dataset] plugins``) registering this dataset's
    # sample types, codecs and ops: ``read_index`` imports them, so that a fresh process (verify, a
    # decoder process, a trainer that never imported the plug-in) reads it. Absent: none needed.
    plugins: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(
        default_factory=dict
    )  # the JSON as read (for tools; code reads typed fields)

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def has_field(self, name: str) -> bool:
        return any(f.name == name for f in self.fields)

    def shards_of(self, split: str | None) -> list[ShardEntry]:
        return [s for s in self.shards if split is None or s.split == split]

    def shard_path(self, entry: ShardEntry) -> Path:
        return self.root / SHARDS_DIR / entry.file

    def files(self) -> list[str]:
        """The files this generation names, relative to the dataset folder (shards, condition
        table)."""
        return Generation(
            self.generation,
            "",
            [s.file for s in self.shards],
            self.conditions.file if self.conditions is not None else None,
        ).files()

    def section(self, name: str | None = None) -> dict[str, Any]:
        """This kind's (or ``name``'s) settings; {} when the index has none."""
        return dict(self.sections.get(self.kind if name is None else name) or {})

    def to_json(self) -> dict[str, Any]:
        """The JSON document for index.json (keys sorted on write, so equal inputs give equal
        bytes)."""
        doc = {
            "format": FORMAT_NAME,
            "shard_version": SHARD_VERSION,
            "version": INDEX_VERSION,
            "name": self.name,
            "kind": self.kind,
            "encoding": self.encoding,
            "fields": [f.to_json() for f in self.fields],
            "tables": list(self.tables),
            "shards": [s.to_json() for s in self.shards],
            "samples": list(self.samples),
            "vocabularies": self.vocabularies,
            "obs_fields": list(self.obs_fields),
            "control_labels": list(self.control_labels),
            "conditions": None if self.conditions is None else self.conditions.to_json(),
            "codec": self.codec,
            "sources": self.sources,
            "stats": self.stats,
            "provenance": self.provenance,
            "sections": self.sections,
            "primary_records": self.primary_records,
            "generation": self.generation,
            "previous": None if self.previous is None else self.previous.to_json(),
            "retired": list(self.retired),
        }
        if self.plugins:  # only when named: an index without plug-ins keeps its bytes
            doc["plugins"] = list(self.plugins)
        # digested as it will read back (tuples become lists, keys strings), so verify recomputes
        # the same
        return doc | {
            "digest": index_digest(json.loads(json.dumps({k: doc.get(k) for k in DIGEST_KEYS})))
        }


# The index's own content, which no shard hash covers: labels of the codes, var_names (in the kind's
# section), the condition table reference, the shard list with each shard's counts, and the number
# of records the plan placed. A digest of each is stored at build; `verify` recomputes them, and so
# does a ShardDataset at open (an entry removed or labels swapped would be served without an error):
# loaders.format.index_check.
DIGEST_KEYS = (
    "conditions",
    "control_labels",
    "obs_fields",
    "plugins",  # from index version 5: what a reader imports is part of what it checks
    "primary_records",
    "sections",
    "shards",
    "vocabularies",
)
# The keys of the first digest (written from 2026-11-24): an index that stores a digest stores at
# least these, so one missing is an edit; the later keys are checked where the digest has them.
FIRST_DIGEST_KEYS = ("conditions", "control_labels", "obs_fields", "sections", "vocabularies")


def index_digest(doc: Mapping[str, Any]) -> dict[str, str]:
    """sha256 per DIGEST_KEYS entry of an index document (as written, or as read back from JSON)."""
    return {
        k: hashlib.sha256(
            json.dumps(doc.get(k), sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        for k in DIGEST_KEYS
    }


def index_path(root: str | Path) -> Path:
    return Path(root) / INDEX_FILE


def read_index_bytes(root: str | Path) -> bytes:
    """index.json's bytes: what a reader opens once and then hands, unchanged, to every process it
    starts."""
    path = index_path(root)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise FormatError(
            f"{path}: no index.json (not a shardsmith dataset, or never committed)"
        ) from None


def index_sha256(data: bytes) -> str:
    """The fingerprint of one committed generation of a dataset (sha256 of index.json's bytes)."""
    return hashlib.sha256(data).hexdigest()


def read_index(
    root: str | Path, data: bytes | None = None, trust_plugins: bool | Iterable[str] = False
) -> Index:
    """The index of ``root``: read now, or parsed from ``data`` (index.json's bytes as read earlier,
    so that every process of one loader sees the same generation even after a rebuild replaced
    the file). Imports the read-side plug-in modules it names (``plugins``), each only if allowed
    (``trust_plugins``: True for every one it names, or the allowed names; an installed modality
    needs no allowance: ``loaders.plugins.check_plugins_allowed``); one not allowed, or missing,
    is a ``PluginError``. Every file name it holds is checked (``loaders.format.names``)."""
    path = index_path(root)
    try:
        raw = json.loads(read_index_bytes(root) if data is None else data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: index.json is not valid JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise FormatError(f"{path}: format is {got!r}, expected {FORMAT_NAME!r}")
    version = raw.get("version")
    if version not in range(1, INDEX_VERSION + 1):
        newer = isinstance(version, int) and version > INDEX_VERSION
        raise FormatError(
            f"{path}: index version {version!r}; this reader understands 1 to {INDEX_VERSION} "
            + (
                "(written by a newer shardsmith: upgrade shardsmith)"
                if newer
                else "(rebuild the dataset with this shardsmith: `shardsmith build MANIFEST --out DIR`)"
            )
        )
    plugins = raw.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(m, str) and m for m in plugins):
        raise FormatError(f"{path}: 'plugins' must be a list of module names, got {plugins!r}")
    check_plugins_allowed(plugins, trust_plugins, needed_by=f"the dataset {Path(root)}")
    for module in plugins:  # first: a plug-in may register a field codec the check below needs
        load_plugin(module, needed_by=f"the dataset {Path(root)}")
    try:
        if raw.get("encoding") not in ENCODINGS:
            raise FormatError(f"{path}: unknown shard encoding {raw.get('encoding')!r}")
        upgrade = INDEX_UPGRADES.get(str(version), None)
        doc = upgrade(raw) if upgrade is not None else raw
        cond = doc.get("conditions")
        fields = [FieldSpec.from_json(f) for f in doc["fields"]]
        _check_codecs(path, fields, version)
        return Index(
            root=Path(root),
            name=str(doc["name"]),
            kind=str(doc["kind"]),
            encoding=str(doc["encoding"]),
            fields=fields,
            tables=[str(t) for t in doc.get("tables", [])],
            shards=[ShardEntry.from_json(s) for s in doc["shards"]],
            samples=[str(s) for s in doc.get("samples", [])],
            vocabularies={
                k: [str(x) for x in v] for k, v in (doc.get("vocabularies") or {}).items()
            },
            obs_fields=[str(f) for f in doc.get("obs_fields") or []],
            control_labels=[str(c) for c in doc.get("control_labels") or []],
            conditions=None if not cond else ConditionsRef.from_json(cond),
            codec=dict(doc.get("codec") or {}),
            sources=list(doc.get("sources") or []),
            stats=dict(doc.get("stats") or {}),
            provenance=dict(doc.get("provenance") or {}),
            sections=dict(doc.get("sections") or {}),
            primary_records=None
            if doc.get("primary_records") is None
            else int(doc["primary_records"]),
            generation=int(doc.get("generation") or 0),
            previous=None if not doc.get("previous") else Generation.from_json(doc["previous"]),
            retired=[str(f) for f in doc.get("retired") or []],
            plugins=list(plugins),
            raw=raw,
        )
    except FormatError as e:  # e.g. a field's bad layout or codec: say which index.json
        if str(path) in str(e):
            raise
        raise FormatError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise FormatError(f"{path}: malformed index.json ({type(e).__name__}: {e})") from None


def _check_codecs(path: Path, fields: list[FieldSpec], version: int) -> None:
    """Field codecs appear only from index version 3, and each must be one this reader knows."""
    named = [f for f in fields if f.codec is not None]
    if named and version < CODEC_INDEX_VERSION:
        raise FormatError(
            f"{path}: field {named[0].name!r} names a codec, which index version {version} cannot"
        )
    if named:
        for f in named:
            get_field_codec(f.codec, f"{path}: field {f.name!r}")


def write_index(index: Index) -> Path:
    """Atomically replace ``index.root``/index.json: the moment a new dataset becomes visible to
    readers."""
    data = json.dumps(index.to_json(), indent=1, sort_keys=True).encode() + b"\n"
    path = index_path(index.root)
    atomic_write_bytes(path, data)
    return path


def __getattr__(name: str) -> Any:
    """A column or table name an installed modality declares (its loader module's ``FORMAT_KEYS``),
    under the name this module gave it before it moved there (``fmt.X``); the modality modules
    are imported on first use (each registers lazily: no op or sample-type module is imported)."""
    if name.isupper():
        keys = format_keys()
        if name in keys:
            return keys[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
