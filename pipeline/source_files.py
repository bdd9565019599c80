"""Which files a manifest's ``[[sources]]`` entries name: each entry's keys checked against its
source type (from the source registry; a missing ``type`` is inferred from the file suffix among
the types feeding the kind), its glob matched (with progress, never over the whole filesystem by
accident, never through a folder link back up the tree) and every file read once.

Apart from :mod:`pipeline.manifest` (the tables) because this part walks the disk.
"""

from __future__ import annotations

import glob
import logging
import threading
import time
from pathlib import Path
from typing import Any

from pipeline.errors import ManifestError
from pipeline.model import SourceSpec
from pipeline.schema import Key, read
from pipeline.source import get_source, infer_type, source_types_for

log = logging.getLogger(__name__)

# A glob reports how far it got every this many seconds while it runs (`/data/**/*.h5ad` over a
# large tree can walk for minutes), and how many files it matched when done.
GLOB_PROGRESS_S = 5.0
# The [[sources]] key that lets a glob walk the whole filesystem (`/**/*.h5ad`): refused otherwise,
# since such a walk takes minutes to hours and nearly always means a path missing its folder.
ALLOW_ROOT_GLOB = "allow_root_glob"
SOURCE_HEAD = {"path": Key("string", doc="a file, folder or glob, relative to the manifest")}
SOURCE_HEAD["type"] = Key("string", None, doc="the source type (default: from the suffix)")


def source_keys(cls: type) -> dict[str, Key]:
    """The keys of a ``[[sources]]`` entry of source type ``cls``: its options are the source's to
    check (any value here)."""
    extra = {o: Key("any", None, doc=f"an option of source type {cls.type!r}") for o in cls.options}
    return {
        **SOURCE_HEAD,
        ALLOW_ROOT_GLOB: Key("boolean", False, doc="allow a glob over /"),
        **extra,
    }


def resolve_sources(
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
