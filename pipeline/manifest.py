"""TOML manifests: what to read, how to plan, how to pack. Every error names the file and the key."""

from __future__ import annotations

import glob
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from pipeline.errors import ManifestError
from pipeline.writers.base import CODECS

KINDS = ("perturbation",)
FORMATS = ("zarr", "tar")
SOURCE_TYPES = ("h5ad", "h5csr")
STRATEGIES = ("batch", "random")
SPLIT_MODES = ("random", "zeroshot", "fewshot")
VALUE_KINDS = ("counts", "any")


@dataclass(frozen=True)
class SourceSpec:
    path: Path
    type: str
    matrix: str


@dataclass(frozen=True)
class Fields:
    perturbation: str = "perturbation"
    control: tuple[str, ...] = ("control",)
    cell_type: str = "cell_type"
    batch: str | None = "batch"
    covariates: tuple[str, ...] = ()
    matrix: str = "X"
    values: str = "any"  # "counts": negative values are an error
    obsm: tuple[str, ...] = ()
    perturbation_features: Path | None = None

    @property
    def obs_fields(self) -> tuple[str, ...]:
        """Logical obs fields in condition-vector order (perturbation, cell_type, batch, covariates...)."""
        names = ("perturbation", "cell_type") + (("batch",) if self.batch else ())
        return names + self.covariates

    def column(self, logical: str) -> str:
        """The source obs column holding a logical field (covariates are their own column name)."""
        return {"perturbation": self.perturbation, "cell_type": self.cell_type, "batch": self.batch or ""}.get(
            logical, logical
        )


@dataclass(frozen=True)
class Pairing:
    strategy: str = "batch"
    max_pairs_per_condition: int = 500
    sentence_size: int = 128


@dataclass(frozen=True)
class Split:
    mode: str = "random"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    val_cell_types: tuple[str, ...] | None = None  # zeroshot: explicit held-out cell types
    test_cell_types: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Manifest:
    path: Path
    name: str
    kind: str
    format: str
    seed: int
    shard_size_mb: float
    codec: str
    codec_level: int
    block_rows: int
    sources: tuple[SourceSpec, ...]
    fields: Fields
    pairing: Pairing
    split: Split
    sha256: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


class _Table:
    """Typed getters over one TOML table that name the offending key on error."""

    def __init__(self, path: Path, name: str, data: Any, known: set[str]) -> None:
        if not isinstance(data, dict):
            raise ManifestError(path, name, "must be a table")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ManifestError(path, f"{name}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(known))})")
        self.path, self.name, self.data = path, name, data

    def get(self, key: str, typ: type | tuple[type, ...], default: Any = ..., choices: tuple[Any, ...] = ()) -> Any:
        if key not in self.data:
            if default is ...:
                raise ManifestError(self.path, f"{self.name}.{key}", "is required")
            return default
        v = self.data[key]
        if isinstance(v, bool) and bool not in (typ if isinstance(typ, tuple) else (typ,)):
            raise ManifestError(self.path, f"{self.name}.{key}", f"expected {typ}, got a boolean")
        if not isinstance(v, typ):
            raise ManifestError(self.path, f"{self.name}.{key}", f"expected {typ}, got {type(v).__name__} {v!r}")
        if choices and v not in choices:
            raise ManifestError(self.path, f"{self.name}.{key}", f"{v!r} is not one of {list(choices)}")
        return v

    def strings(self, key: str, default: Any = ...) -> tuple[str, ...] | None:
        v = self.get(key, (list, str, type(None)), default)
        if v is None:
            return None
        v = [v] if isinstance(v, str) else v
        if not all(isinstance(s, str) for s in v):
            raise ManifestError(self.path, f"{self.name}.{key}", "must be a list of strings")
        return tuple(v)


def load_manifest(path: str | Path) -> Manifest:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ManifestError(path, "-", f"cannot read manifest ({e.strerror or e})") from None
    try:
        raw = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(path, "-", f"not valid TOML: {e}") from None
    top = _Table(path, "manifest", raw, {"dataset", "sources", "fields", "pairing", "split"})
    ds = _Table(path, "dataset", top.get("dataset", dict),
                {"name", "kind", "format", "seed", "shard_size_mb", "codec", "codec_level", "block_rows"})
    fl = _Table(path, "fields", top.get("fields", dict, {}),
                {"perturbation", "control", "cell_type", "batch", "covariates", "matrix", "values", "obsm",
                 "perturbation_features"})
    pr = _Table(path, "pairing", top.get("pairing", dict, {}), {"strategy", "max_pairs_per_condition", "sentence_size"})
    sp = _Table(path, "split", top.get("split", dict, {}),
                {"mode", "val_fraction", "test_fraction", "val_cell_types", "test_cell_types"})

    matrix = fl.get("matrix", str, "X")
    sources = _parse_sources(path, top.get("sources", list), matrix)
    features = fl.get("perturbation_features", str, None)
    if features is not None:
        fpath = (path.parent / features).resolve()
        if fpath.suffix not in (".npy", ".npz", ".csv"):
            raise ManifestError(path, "fields.perturbation_features", "must be .npy, .npz or .csv (never pickle)")
        if not fpath.exists():
            raise ManifestError(path, "fields.perturbation_features", f"file not found: {fpath}")
    fields = Fields(
        perturbation=fl.get("perturbation", str, "perturbation"),
        control=fl.strings("control", ("control",)) or ("control",),
        cell_type=fl.get("cell_type", str, "cell_type"),
        batch=fl.get("batch", (str, type(None)), "batch") or None,
        covariates=fl.strings("covariates", ()) or (),
        matrix=matrix,
        values=fl.get("values", str, "any", VALUE_KINDS),
        obsm=fl.strings("obsm", ()) or (),
        perturbation_features=Path(fpath) if features is not None else None,
    )
    if not fields.control:
        raise ManifestError(path, "fields.control", "needs at least one control label")
    pairing = Pairing(
        strategy=pr.get("strategy", str, "batch", STRATEGIES),
        max_pairs_per_condition=pr.get("max_pairs_per_condition", int, 500),
        sentence_size=pr.get("sentence_size", int, 128),
    )
    if pairing.max_pairs_per_condition < 0:
        raise ManifestError(path, "pairing.max_pairs_per_condition", "must be >= 0")
    if pairing.sentence_size < 1:
        raise ManifestError(path, "pairing.sentence_size", "must be >= 1")
    split = Split(
        mode=sp.get("mode", str, "random", SPLIT_MODES),
        val_fraction=float(sp.get("val_fraction", (int, float), 0.1)),
        test_fraction=float(sp.get("test_fraction", (int, float), 0.1)),
        val_cell_types=sp.strings("val_cell_types", None),
        test_cell_types=sp.strings("test_cell_types", None),
    )
    for key in ("val_fraction", "test_fraction"):
        if not 0.0 <= getattr(split, key) < 1.0:
            raise ManifestError(path, f"split.{key}", "must be in [0, 1)")
    if split.val_fraction + split.test_fraction >= 1.0:
        raise ManifestError(path, "split", "val_fraction + test_fraction must be < 1")
    shard_mb = float(ds.get("shard_size_mb", (int, float), 64))
    if shard_mb <= 0:
        raise ManifestError(path, "dataset.shard_size_mb", "must be > 0")
    block_rows = ds.get("block_rows", int, 16384)
    if block_rows < 1:
        raise ManifestError(path, "dataset.block_rows", "must be >= 1")
    return Manifest(
        path=path,
        name=ds.get("name", str),
        kind=ds.get("kind", str, "perturbation", KINDS),
        format=ds.get("format", str, "zarr", FORMATS),
        seed=ds.get("seed", int, 0),
        shard_size_mb=shard_mb,
        codec=ds.get("codec", str, "blosc-lz4", CODECS),
        codec_level=ds.get("codec_level", int, 5),
        block_rows=block_rows,
        sources=sources,
        fields=fields,
        pairing=pairing,
        split=split,
        sha256=hashlib.sha256(data).hexdigest(),
        raw=raw,
    )


def _parse_sources(path: Path, items: list[Any], matrix: str) -> tuple[SourceSpec, ...]:
    if not items:
        raise ManifestError(path, "sources", "needs at least one [[sources]] entry")
    out: list[SourceSpec] = []
    for i, item in enumerate(items):
        t = _Table(path, f"sources[{i}]", item, {"path", "type", "matrix"})
        pattern = t.get("path", str)
        typ = t.get("type", str, None, SOURCE_TYPES) or _guess_type(path, i, pattern)
        full = pattern if Path(pattern).is_absolute() else str(path.parent / pattern)
        matches = sorted(glob.glob(full)) if glob.has_magic(full) else [full]
        if not matches:
            raise ManifestError(path, f"sources[{i}].path", f"no file matches {pattern!r} (looked for {full})")
        for m in matches:
            if not Path(m).is_file():
                raise ManifestError(path, f"sources[{i}].path", f"file not found: {m}")
            out.append(SourceSpec(Path(m).resolve(), typ, t.get("matrix", str, matrix)))
    return tuple(out)


def _guess_type(path: Path, i: int, pattern: str) -> str:
    if pattern.endswith(".h5ad"):
        return "h5ad"
    if pattern.endswith((".h5", ".hdf5")):
        return "h5csr"
    raise ManifestError(path, f"sources[{i}].type", f"cannot guess the type of {pattern!r}; set one of {SOURCE_TYPES}")
