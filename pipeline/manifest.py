"""TOML manifests: what to read, which kind of dataset to build, how to pack. Every error names the
file and the key.

The generic part is ``[dataset]`` and ``[[sources]]``; every other top-level table belongs to the
dataset kind (``pipeline.model.Kind``), which parses and validates it. Source types come from the
source registry (``pipeline.source``): a missing ``type`` is inferred from the file suffix among
the types feeding the kind. ``[dataset] plugins`` lists modules imported first, so user-defined
kinds, sources and sample types register.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from loaders.plugins import PluginError, load_plugin
from pipeline.errors import ManifestError
from pipeline.model import KINDS, Manifest, SourceSpec, get_kind, kind_names
from pipeline.schema import Key, check, key, near, read
from pipeline.source import get_source, infer_type, source_types_for
from pipeline.writers.base import CODECS, LEVELS

log = logging.getLogger(__name__)

FORMATS = ("zarr", "tar")
# A glob reports how far it got every this many seconds while it runs (`/data/**/*.h5ad` over a
# large tree can walk for minutes), and how many files it matched when done.
GLOB_PROGRESS_S = 5.0
# The [[sources]] key that lets a glob walk the whole filesystem (`/**/*.h5ad`): refused otherwise,
# since such a walk takes minutes to hours and nearly always means a path missing its folder.
ALLOW_ROOT_GLOB = "allow_root_glob"
# A shard holds at least one record whatever the size asked for; below ~100 bytes the request is a
# typo (5e-5 or 1e-9 MB meant one shard per record, or millions of them).
MIN_SHARD_MB = 1e-4
DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SOURCE_HEAD = {"path": Key("string", doc="a file, folder or glob, relative to the manifest")}
SOURCE_HEAD["type"] = Key("string", None, doc="the source type (default: from the suffix)")


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
        minimum=MIN_SHARD_MB,
        fix="MB of payload per shard; 64 is a good default",
    )
    codec: str = key("string", "blosc-lz4", choices=tuple(CODECS))
    codec_level: int = key("integer", 5, doc="the codec's level (blosc 0..9, zstd 1..22)")
    block_rows: int = key("integer", 16384, minimum=1, doc="rows read per block")
    plugins: tuple[str, ...] = key("strings", (), doc="modules imported first (plug-in kinds)")


DATASET_KEYS = set(Dataset.__dataclass_fields__)


def source_keys(cls: type) -> dict[str, Key]:
    """The keys of a ``[[sources]]`` entry of source type ``cls``: its options are the source's to
    check (any value here)."""
    extra = {o: Key("any", None, doc=f"an option of source type {cls.type!r}") for o in cls.options}
    return {
        **SOURCE_HEAD,
        ALLOW_ROOT_GLOB: Key("boolean", False, doc="allow a glob over /"),
        **extra,
    }


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
    except RecursionError:
        raise ManifestError(
            path, "-", "not a manifest: arrays or tables nested too deeply to read"
        ) from None
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
    read(
        path,
        "manifest",
        raw,
        dict.fromkeys(("dataset", "sources", *kind.sections), Key("any", None)),
    )
    sections = {
        name: read(path, name, raw.get(name), kind.section_types[name])
        if name in kind.section_types
        else raw.get(name)
        for name in kind.sections
    }
    config = kind.parse(path, sections)
    items = check(path, "manifest.sources", raw.get("sources", []), Key("list"))
    sources = _parse_sources(path, kind_name, items, kind.source_defaults(config))
    level, levels = ds["codec_level"], LEVELS[ds["codec"]]
    if level not in levels:
        raise ManifestError(
            path,
            "dataset.codec_level",
            f"{level} is outside {levels.start}..{levels.stop - 1}, the levels of codec {ds['codec']!r}",
        )
    name = ds["name"]
    if not DATASET_NAME.fullmatch(name) or set(name) <= {"."}:
        raise ManifestError(
            path,
            "dataset.name",
            f"{name!r} is not a plain name (letters, digits, '.', '_', "
            "'-'; no '/' or '..'): it names the default output folder shards/<name>",
        )
    return Manifest(
        path=path,
        name=name,
        kind=kind_name,
        format=ds["format"],
        seed=ds["seed"],
        shard_size_mb=float(ds["shard_size_mb"]),
        codec=ds["codec"],
        codec_level=level,
        block_rows=ds["block_rows"],
        sources=sources,
        config=config,
        plugins=tuple(ds["plugins"]),
        sha256=hashlib.sha256(data).hexdigest(),
        raw=raw,
    )


def _parse_sources(
    path: Path, kind: str, items: list[Any], defaults: dict[str, Any]
) -> tuple[SourceSpec, ...]:
    if not items:
        raise ManifestError(path, "sources", "needs at least one [[sources]] entry")
    out: list[SourceSpec] = []
    seen: dict[Path, tuple[int, str]] = {}  # real path -> (entry, the path it was matched as)
    for i, item in enumerate(items):
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
        t = read(path, f"sources[{i}]", item, source_keys(cls))
        opts = {k: item[k] for k in cls.options if k in item}
        matrix = str(opts.pop("matrix", defaults.get("matrix", "X")))
        full = pattern if Path(pattern).is_absolute() else str(path.parent / pattern)
        if glob.has_magic(full):
            root = _glob_root(full)
            if root is not None and not t[ALLOW_ROOT_GLOB]:
                raise ManifestError(
                    path,
                    f"sources[{i}].path",
                    f"{pattern!r} is a glob over the whole filesystem (its fixed part is {root}): "
                    "name the folder holding the files, or set "
                    f"{ALLOW_ROOT_GLOB} = true in this entry if you mean it",
                )
            matches = _glob(full, f"sources[{i}].path {pattern!r}")
        else:
            matches = [full]
        matches = [m for m in matches if not _through_a_link_cycle(Path(m))]
        if not matches:
            raise ManifestError(
                path, f"sources[{i}].path", f"no file matches {pattern!r} (looked for {full})"
            )
        for m in matches:
            if not Path(m).exists():
                raise ManifestError(path, f"sources[{i}].path", f"file not found: {m}")
            files = cls.expand(Path(m).resolve())
            if not files:
                raise ManifestError(path, f"sources[{i}].path", f"no input file in {m}")
            for f in files:
                folder = f.is_dir() and getattr(cls, "folders", False)  # a DICOM series
                if not (f.is_file() or folder):
                    raise ManifestError(path, f"sources[{i}].path", f"file not found: {f}")
                real = f.resolve()
                if real in seen:
                    j, first = seen[real]
                    raise ManifestError(
                        path,
                        f"sources[{i}].path",
                        f"{m} is the file {first} already named by "
                        f"sources[{j}] (same real path {real}): a file is read once; "
                        "narrow the glob or drop one entry",
                    )
                seen[real] = (i, m)
                out.append(SourceSpec(f, typ, matrix, tuple(sorted(opts.items()))))
    return tuple(out)


def _glob_root(full: str) -> str | None:
    """The filesystem root when the fixed part of the glob ``full`` (its folders before the first
    wildcard, ``..`` resolved) is the root itself, else None."""
    parts = Path(full).absolute().parts
    fixed = next((n for n, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    base, anchor = Path(*parts[:fixed]), Path(parts[0])
    return str(anchor) if base.resolve() == anchor.resolve() else None


def _glob(full: str, what: str) -> list[str]:
    """The sorted matches of ``full``, logging every GLOB_PROGRESS_S how many so far and, when done,
    how many in all (INFO). The walk runs in a thread so that progress is told even while it
    matches nothing (a walk over a large tree that finds no file is silent inside ``glob``)."""
    found: list[str] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def walk() -> None:
        try:
            for match in glob.iglob(full, recursive=True):
                found.append(match)  # one by one: the progress line counts them as they come
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            failed.append(e)
        finally:
            done.set()

    t0 = time.monotonic()
    threading.Thread(target=walk, name="manifest-glob", daemon=True).start()
    while not done.wait(GLOB_PROGRESS_S):
        log.info(
            "%s: still matching, %d file(s) so far after %.0f s",
            what,
            len(found),
            time.monotonic() - t0,
        )
    if failed:
        raise failed[0]
    log.info("%s: %d file(s) matched in %.1f s", what, len(found), time.monotonic() - t0)
    return sorted(found)


def _through_a_link_cycle(match: Path) -> bool:
    """Whether a glob match reached its file through a folder link pointing at one of its own
    ancestors (``src/sub/up -> ..``): ``glob`` follows such links until the path is too long, one
    copy per level."""
    parts = match.absolute().parts
    for n in range(2, len(parts)):
        folder = Path(*parts[:n])
        if folder.is_symlink():
            target = folder.resolve()
            if folder.parent.resolve().is_relative_to(target):
                return True
    return False
