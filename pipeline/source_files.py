"""Which files a manifest's ``[[sources]]`` entries name: each entry (its keys checked by
:mod:`pipeline.manifest`) has its glob matched (with progress, never over the whole filesystem by
accident, never through a folder link back up the tree), its folders expanded by its source type,
and every file read once.

Apart from :mod:`pipeline.manifest` (the tables) because this part walks the disk.
"""

from __future__ import annotations

import glob
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ManifestError
from pipeline.model import SourceSpec
from pipeline.source import Source

log = logging.getLogger(__name__)

# A glob reports how far it got every this many seconds while it runs (`/data/**/*.h5ad` over a
# large tree can walk for minutes), and how many files it matched when done.
GLOB_PROGRESS_S = 5.0
# The [[sources]] key that lets a glob walk the whole filesystem (`/**/*.h5ad`): refused otherwise,
# since such a walk takes minutes to hours and nearly always means a path missing its folder.
ALLOW_ROOT_GLOB = "allow_root_glob"


@dataclass(frozen=True)
class SourceEntry:
    """One ``[[sources]]`` entry as the manifest checked it (:func:`pipeline.manifest.source_entry`):
    what this module matches on disk."""

    number: int  # its position among the entries: sources[number]
    pattern: str  # a file, folder or glob, relative to the manifest
    type: str
    source: type[Source]  # expands folders into files (and may take folders: DICOM series)
    matrix: str
    options: tuple[tuple[str, Any], ...]
    allow_root_glob: bool


def resolve_sources(path: Path, entries: Iterable[SourceEntry]) -> tuple[SourceSpec, ...]:
    """The files the entries name, in entry order then sorted glob order; each entry is taken
    from ``entries`` once the one before it matched (so a lazy iterable checks entry i+1 after
    entry i's files)."""
    out: list[SourceSpec] = []
    seen: dict[Path, tuple[int, str]] = {}  # real path -> (entry, the path it was matched as)
    for e in entries:
        where, pattern = f"sources[{e.number}].path", e.pattern
        full = pattern if Path(pattern).is_absolute() else str(path.parent / pattern)
        if glob.has_magic(full):
            root = _glob_root(full)
            if root is not None and not e.allow_root_glob:
                raise ManifestError(
                    path,
                    where,
                    f"{pattern!r} is a glob over the whole filesystem (its fixed part is {root}): "
                    "name the folder holding the files, or set "
                    f"{ALLOW_ROOT_GLOB} = true in this entry if you mean it",
                )
            matches = _glob(full, f"{where} {pattern!r}")
        else:
            matches = [full]
        matches = [m for m in matches if not _through_a_link_cycle(Path(m))]
        if not matches:
            raise ManifestError(path, where, f"no file matches {pattern!r} (looked for {full})")
        for m in matches:
            if not Path(m).exists():
                raise ManifestError(path, where, f"file not found: {m}")
            files = e.source.expand(Path(m).resolve())
            if not files:
                raise ManifestError(path, where, f"no input file in {m}")
            for f in files:
                folder = f.is_dir() and getattr(e.source, "folders", False)  # a DICOM series
                if not (f.is_file() or folder):
                    raise ManifestError(path, where, f"file not found: {f}")
                real = f.resolve()
                if real in seen:
                    j, first = seen[real]
                    raise ManifestError(
                        path,
                        where,
                        f"{m} is the file {first} already named by "
                        f"sources[{j}] (same real path {real}): a file is read once; "
                        "narrow the glob or drop one entry",
                    )
                seen[real] = (e.number, m)
                out.append(SourceSpec(f, e.type, e.matrix, e.options))
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
