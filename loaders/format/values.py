"""The value types index.json is made of, each with its JSON form: a record field (:class:`FieldSpec`,
with the flat column keys it occupies inside a shard), a shard (:class:`ShardEntry`) and the
condition table's reference (:class:`ConditionsRef`).

Why a module of its own: ``loaders.format`` is the document (versions, folder layout, ``Index``,
reading, upgrading and writing index.json, its digest); these are the parts it is assembled from,
and they are what most of the code handles (the arena and window decode, the column readers, the
integrity checks, the writers), without needing the document's reading, plug-in loading or
upgrades. They read and write no file and know no format version; ``loaders.format`` re-exports
them (``fmt.FieldSpec``), as the contract they belong to.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from loaders.format.digests import tagged
from loaders.format.errors import FormatError
from loaders.format.names import checked_name

LAYOUTS = (
    "dense",
    "csr",
    "ragged",
)  # how a record field is stored (never called "kind": a dataset has a kind)


@dataclass(frozen=True)
class FieldSpec:
    """One record field: ``layout`` says how it is stored, ``shape`` the shape of one record's value
    (for ``ragged``: of one list element; for ``csr``: ``(n_cols,)``). ``bound``: integer values
    must lie in ``[0, bound)`` (codes into a vocabulary or table of that many rows), checked
    wherever a shard is read."""

    name: str
    layout: str
    dtype: str
    shape: tuple[int, ...] = ()
    bound: int | None = None
    codec: Mapping[str, Any] | None = (
        None  # this field's own codec (loaders.format.codecs), else the dataset's
    )

    def __post_init__(self) -> None:
        if (
            self.codec is not None
        ):  # stored as sorted items: the spec stays hashable and compares by value
            if self.layout != "dense":
                raise FormatError(f"field {self.name!r}: only dense fields take a codec")
            if not isinstance(self.codec, Mapping) or not isinstance(self.codec.get("id"), str):
                raise FormatError(
                    f'field {self.name!r}: codec must be an object with an "id", got {self.codec!r}'
                )
            object.__setattr__(self, "codec", _FrozenConfig(self.codec))
        if self.layout not in LAYOUTS:
            raise FormatError(
                f"field {self.name!r}: unknown layout {self.layout!r} (expected one of {LAYOUTS})"
            )
        if self.layout == "csr" and len(self.shape) != 1:
            raise FormatError(f"field {self.name!r}: a csr field has shape (n_cols,)")

    def keys(self) -> tuple[str, ...]:
        """The flat column keys of this field in a shard (pointers first)."""
        if self.layout == "dense":
            return (self.name,)
        if self.layout == "csr":
            return csr_keys(self.name)
        return ragged_keys(self.name)

    @property
    def pointer(self) -> str | None:
        """The key of the row-pointer column (csr, ragged), else None."""
        return None if self.layout == "dense" else self.keys()[0]

    @property
    def payload(self) -> str:
        """The key of the column holding the values (``data`` for csr, ``values`` for ragged)."""
        return self.keys()[-1]

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "layout": self.layout,
            "dtype": self.dtype,
            "shape": list(self.shape),
        }
        if self.bound is not None:
            d["bound"] = int(self.bound)
        if self.codec is not None:
            d["codec"] = dict(self.codec)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> FieldSpec:
        layout = d["layout"] if "layout" in d else d["kind"]  # index v1 said "kind"
        bound = d.get("bound")
        return FieldSpec(
            str(d["name"]),
            str(layout),
            str(d["dtype"]),
            tuple(int(s) for s in d["shape"]),
            None if bound is None else int(bound),
            d.get("codec"),
        )


class _FrozenConfig(dict):  # type: ignore[type-arg]
    """A codec config that hashes (FieldSpec is frozen and hashable); JSON-serialises as the dict it
    is."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True, default=str))


def column_codecs(fields: Iterable[FieldSpec]) -> dict[str, dict[str, Any]]:
    """Column key -> its field's own codec config, for the fields that name one."""
    return {f.name: dict(f.codec) for f in fields if f.codec is not None}


def csr_keys(name: str) -> tuple[str, str, str]:
    """``(indptr, indices, data)`` keys of a csr field."""
    return (f"{name}/indptr", f"{name}/indices", f"{name}/data")


def ragged_keys(name: str) -> tuple[str, str]:
    """``(offsets, values)`` keys of a ragged field."""
    return (f"{name}/offsets", f"{name}/values")


def shard_keys(fields: Iterable[FieldSpec], tables: Iterable[str] = ()) -> list[str]:
    """Every flat key a shard with these fields and tables holds, in a fixed order."""
    return [k for f in fields for k in f.keys()] + list(tables)


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the index describes it. ``units`` maps each sample type the dataset serves to
    the number of its units in this shard (what an epoch of that sample type iterates)."""

    file: str
    split: str
    records: int  # rows stored (duplicated records included)
    units: Mapping[str, int]
    bytes: int  # on disk
    raw_bytes: int  # uncompressed payload
    digest: str  # content digest, algorithm named ("xxh3_128:<hex>"; loaders.format.digests)
    plan_key: str
    source: int = -1  # manifest source ordinal whose rows it holds (-1 if mixed or not applicable)
    part: int = 0  # shard number within its (source, split)

    def units_of(self, sample: str) -> int:
        try:
            return int(self.units[sample])
        except KeyError:
            raise FormatError(
                f"shard {self.file}: index.json counts no units of sample type {sample!r} "
                f"(it counts {sorted(self.units)})"
            ) from None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["units"] = {k: int(v) for k, v in sorted(self.units.items())}
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ShardEntry:
        return ShardEntry(
            file=checked_name(d["file"], "shards[].file"),
            split=str(d["split"]),
            records=int(d["records"]),
            units={str(k): int(v) for k, v in dict(d["units"]).items()},
            bytes=int(d["bytes"]),
            raw_bytes=int(d["raw_bytes"]),
            digest=_digest(d),
            plan_key=str(d["plan_key"]),
            source=int(d.get("source", -1)),
            part=int(d.get("part", 0)),
        )


@dataclass(frozen=True)
class ConditionsRef:
    """The condition table: a file beside index.json holding ``vectors`` [rows, dim] (and
    ``codes``)."""

    file: str
    rows: int
    dim: int
    digest: str = ""  # content digest, algorithm named, as a shard's
    bytes: int = 0
    segments: list[Any] = field(
        default_factory=list
    )  # which obs field fills which columns of a vector

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ConditionsRef:
        rows = d["rows"] if "rows" in d else d["n"]  # index v1 said "n"
        return ConditionsRef(
            file=checked_name(d["file"], "conditions.file"),
            rows=int(rows),
            dim=int(d.get("dim", 0)),
            digest=_digest(d),
            bytes=int(d.get("bytes", 0)),
            segments=list(d.get("segments", [])),
        )


def _digest(d: Mapping[str, Any]) -> str:
    """An entry's content digest, named: ``digest`` (index version 4 on), else the bare ``sha256``
    of versions 1-3 as ``"sha256:<hex>"``; "" when the entry records none."""
    if "digest" in d:
        return str(d["digest"])
    return tagged(str(d.get("sha256") or ""))
