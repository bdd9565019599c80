"""TOML manifests: what to read, which kind of dataset to build, how to pack. Every error names the
file and the key.

The generic part is ``[dataset]`` (declared here) and ``[[sources]]`` (the files they name:
:mod:`pipeline.source_files`); every other top-level table belongs to the dataset kind
(``pipeline.model.Kind.section_types``): each table is checked against its declaration by the one
validator (:func:`pipeline.schema.read`), then the kind applies the rules between its keys.
``[dataset] plugins`` lists modules imported first, so user-defined kinds, sources and sample
types register.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaders.plugins import PluginError, load_plugin
from pipeline.errors import ManifestError
from pipeline.model import KINDS, Manifest, SourceSpec, get_kind, kind_names
from pipeline.schema import Key, check, key, near, read, toml_table
from pipeline.source import get_source, infer_type, source_types_for
from pipeline.source_files import ALLOW_ROOT_GLOB, SourceEntry, resolve_sources
from pipeline.writers.base import CODECS, LEVELS

# Manifest and SourceSpec live in pipeline.model; modules that read a manifest import them from here
__all__ = ["Dataset", "Manifest", "SourceSpec", "load_manifest", "load_plugins"]
FORMATS = ("zarr", "tar")
# A shard holds at least one record whatever the size asked for; below ~100 bytes the request is a
# typo (5e-5 or 1e-9 MB meant one shard per record, or millions of them).
MIN_SHARD_MB = 1e-4
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # so never "." or ".."
SOURCE_HEAD = {"path": Key("string", doc="a file, folder or glob, relative to the manifest")}
SOURCE_HEAD["type"] = Key("string", None, doc="the source type (default: from the suffix)")
ROOT_GLOB_KEY = Key("boolean", False, doc="allow a glob over /")


@dataclass(frozen=True)
class Dataset:
    """[dataset]: the generic part of every manifest (the kind's own tables follow)."""

    name: str = key("string", doc="a plain name; the default output folder is shards/<name>")
    kind: str | None = key("string", None, doc="the dataset kind (default: the default kind)")
    format: str = key("string", "zarr", choices=FORMATS, doc="zarr shards or WebDataset tars")
    seed: int = key("integer", 0, minimum=0, fix="a seed is an integer >= 0")
    shard_size_mb: float = key(
        "number",
        64,
        finite=True,
        convert=float,
        minimum=MIN_SHARD_MB,
        fix="MB of payload per shard; 64 is a good default",
    )
    codec: str = key("string", "blosc-lz4", choices=tuple(CODECS))
    codec_level: int = key("integer", 5, doc="the codec's level (blosc 0..9, zstd 1..22)")
    block_rows: int = key("integer", 16384, minimum=1, doc="rows read per block")
    plugins: tuple[str, ...] = key("strings", (), doc="modules imported first (plug-in kinds)")


def load_plugins(path: Path, modules: tuple[str, ...]) -> None:
    """Import each plug-in module and its build half (``BUILD_MODULE``), so its kinds and sources
    register."""
    for name in modules:
        try:
            load_plugin(name, build=True)
        except PluginError as e:
            raise ManifestError(path, "dataset.plugins", str(e)) from None
        except Exception as e:  # noqa: BLE001 - a plug-in's own bug is bad input here, named with its module
            raise ManifestError(
                path,
                "dataset.plugins",
                f"cannot import plug-in module {name!r} ({type(e).__name__}: {e})",
            ) from None


def default_kind(path: Path) -> str:
    """The kind of a manifest that names none: the one a modality declared the default."""
    KINDS.discover()
    if KINDS.default is None:
        raise ManifestError(path, "dataset.kind", f"is required (one of {kind_names()})")
    return KINDS.default


def source_keys(cls: type) -> dict[str, Key]:
    """The keys of a ``[[sources]]`` entry of source type ``cls``: its options are the source's to
    check (any value here)."""
    extra = {o: Key("any", None, doc=f"an option of source type {cls.type!r}") for o in cls.options}
    return {**SOURCE_HEAD, ALLOW_ROOT_GLOB: ROOT_GLOB_KEY, **extra}


def source_entry(path: Path, i: int, item: Any, kind: str, defaults: dict[str, Any]) -> SourceEntry:
    """``[[sources]]`` entry ``i`` checked against its source type (from the source registry; a
    missing ``type`` is inferred from the file suffix among the types feeding the kind)."""
    head = read(
        path, f"sources[{i}]", item, {**dict.fromkeys(item or (), Key("any")), **SOURCE_HEAD}
    )
    pattern = head["path"]
    typ = head["type"] or infer_type(pattern, kind)
    if typ is None:
        claims = {t: list(get_source(t).suffixes) for t in source_types_for(kind)}
        raise ManifestError(
            path,
            f"sources[{i}].type",
            f"cannot infer the type of {pattern!r} from its suffix; "
            f"set one of the source types of kind {kind!r}: {claims}",
        )
    try:
        cls = get_source(typ)
    except ValueError:
        cls = None
    if cls is None or kind not in cls.kinds:
        raise ManifestError(
            path,
            f"sources[{i}].type",
            f"{typ!r} is not one of {source_types_for(kind)} (source types of kind {kind!r})",
        )
    allow_root_glob = read(path, f"sources[{i}]", item, source_keys(cls))[ALLOW_ROOT_GLOB]
    opts = {k: item[k] for k in cls.options if k in item}
    matrix = str(opts.pop("matrix", defaults.get("matrix", "X")))
    return SourceEntry(i, pattern, typ, cls, matrix, tuple(sorted(opts.items())), allow_root_glob)


def load_manifest(path: str | Path) -> Manifest:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ManifestError(path, "-", f"cannot read manifest ({e.strerror or e})") from None
    raw = toml_table(path, data)
    if not isinstance(raw.get("dataset"), dict):
        raise ManifestError(path, "dataset", "is required (a [dataset] table)")
    ds = read(path, "dataset", raw["dataset"], Dataset)
    load_plugins(path, ds["plugins"])  # an empty name: load_plugins says why
    kind_name = ds["kind"] or default_kind(path)
    try:
        kind = get_kind(kind_name)
    except ValueError:
        raise ManifestError(
            path,
            "dataset.kind",
            f"{kind_name!r} is not one of {kind_names()}{near(kind_name, kind_names())} "
            "(a plug-in kind's module goes in [dataset] plugins)",
        ) from None
    tables = dict.fromkeys(("dataset", "sources", *kind.sections), Key("any", None))
    read(path, "manifest", raw, tables)  # no table the kind does not own
    sections = {
        name: read(path, name, raw.get(name), kind.section_types[name])
        if name in kind.section_types
        else raw.get(name)
        for name in kind.sections
    }
    config = kind.parse(path, sections)
    items = check(path, "manifest.sources", raw.get("sources", []), Key("list"))
    if not items:
        raise ManifestError(path, "sources", "needs at least one [[sources]] entry")
    defaults = kind.source_defaults(config)
    entries = (source_entry(path, i, item, kind_name, defaults) for i, item in enumerate(items))
    sources = resolve_sources(path, entries)  # entry i+1 checked once entry i matched its files
    level, levels = ds["codec_level"], LEVELS[ds["codec"]]
    if level not in levels:
        raise ManifestError(
            path,
            "dataset.codec_level",
            f"{level} is outside {levels.start}..{levels.stop - 1}, the levels of codec {ds['codec']!r}",
        )
    if not DATASET_NAME.fullmatch(ds["name"]):
        raise ManifestError(
            path,
            "dataset.name",
            f"{ds['name']!r} is not a plain name (letters, digits, '.', '_', "
            "'-'; no '/' or '..'): it names the default output folder shards/<name>",
        )
    return Manifest(
        path=path,
        **{**ds, "kind": kind_name},
        sources=sources,
        config=config,
        sha256=hashlib.sha256(data).hexdigest(),
        raw=raw,
    )
