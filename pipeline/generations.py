"""Which files in an output folder are ours, which a reader may still use, and which may go.

A build deletes only files that shardsmith itself named: those a committed index named (shards,
condition tables), those a build announced in its journal before writing them, and its own
temporary files (`.spill-<pid>/`, `.tmp-<name>-<pid>`, `.index.json.*.tmp`). Anything else in the
folder is never touched, and a folder without an index that holds anything else is refused
(`check_owned`), so `--out .` in a repository cannot wipe `./shards/*`.

Generations: shards are immutable and content-named (their name holds the plan key, a digest of
everything that decides their bytes; an existing file is never rewritten). Commit N+1 keeps
generation N's files (`Index.previous`) and retires generation N-1's files that neither names: a
reader that opened generation N keeps working until N+2 is committed. The retired list is written
into the index before anything is deleted, so a kill during cleanup leaves a list that the next
build (even an up-to-date one) or `shardsmith gc` finishes.

Journal: before writing any shard, a build writes ``.build-<pid>.journal`` naming every file it
is about to create. A build killed with ``kill -9`` leaves the journal; the next build under the
lock (or gc) knows these files are ours: it reuses them if its plan names them, and deletes the
rest.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from loaders import format as fmt
from pipeline.errors import NothingKeptError, OutputError
from pipeline.incremental import INPUTS_FILE
from pipeline.lock import LOCK_FILE, exclusive, output_error
from pipeline.paths import inside, shard_inside

log = logging.getLogger(__name__)

JOURNAL_RE = re.compile(r"\.build-\d+\.journal$")
SPILL_RE = re.compile(r"\.spill-\d+$")
TMP_RE = re.compile(r"\.tmp-(?P<target>.+)-\d+$")  # pipeline.shardfile.write_columns' temp names
OUR_NAME_RE = re.compile(
    r"(?:[a-z]+-\d{3,}-\d{3,}|conditions)-[0-9a-f]{16}(?:\.[a-z]+)?"
)  # shards, tables
ATOMIC_TMP_RE = re.compile(
    r"\.(index\.json|\.build-inputs\.json)\.\w+\.tmp$"
)  # fmt.atomic_write_bytes'
FIXED = {LOCK_FILE, INPUTS_FILE}
SHOWN = 5  # foreign entries named in the refusal


def journal_path(out: Path) -> Path:
    return out / f".build-{os.getpid()}.journal"


def write_journal(out: Path, files: Iterable[str]) -> Path:
    """Announce the files (relative to ``out``) this build may create, before creating any."""
    path = journal_path(out)
    fmt.atomic_write_bytes(
        path, json.dumps({"pid": os.getpid(), "files": sorted(set(files))}).encode()
    )
    return path


def journals(out: Path) -> list[Path]:
    return sorted(p for p in out.glob(".build-*.journal") if JOURNAL_RE.fullmatch(p.name))


def ours_only(out: Path, names: Iterable[object], where: str) -> set[str]:
    """The names that stay inside ``out``; the others are logged (with where they came from) and
    dropped."""
    names = list(names)
    kept = {n for n in names if inside(out, n)}
    dropped = [n for n in names if n not in kept]
    if dropped:
        log.warning(
            "%s: ignoring %d name(s) in %s that lead outside the dataset folder (never deleted): %s",
            out,
            len(dropped),
            where,
            ", ".join(map(repr, dropped[:SHOWN])),
        )
    return kept  # type: ignore[return-value]


def journaled(out: Path, skip: Path | None = None) -> set[str]:
    """Every file named by a journal in ``out`` (but ``skip``): ours, whatever build wrote them."""
    files: set[str] = set()
    for p in journals(out):
        if p == skip:
            continue
        try:
            files |= ours_only(out, json.loads(p.read_text())["files"], p.name)
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("ignoring an unreadable build journal %s", p)
    return files


def index_digest(out: Path) -> str:
    return hashlib.sha256(fmt.index_path(out).read_bytes()).hexdigest()


def live(index: fmt.Index | None) -> set[str]:
    """Files a reader may use: the committed generation's and the one before it."""
    if index is None:
        return set()
    return set(index.files()) | set(index.previous.files() if index.previous is not None else [])


def _is_our_index(path: Path) -> bool:
    """Whether index.json is a shardsmith index (of any version). Our writer's spelling is found
    without parsing (an index with large vocabularies takes tens of ms to parse, on every build);
    else parse."""
    try:
        data = path.read_bytes()
        if f'"format": "{fmt.FORMAT_NAME}"'.encode() in data:
            return True
        doc = json.loads(data)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == fmt.FORMAT_NAME


def _temp_of(name: str, prefix: str, owned: set[str]) -> bool:
    """A half-written file of ours: the temp name of a file we own, or of one named the way we name
    shards and condition tables (left by a build from before journals existed)."""
    m = TMP_RE.fullmatch(name)
    return bool(m) and (
        prefix + m.group("target") in owned or OUR_NAME_RE.fullmatch(m.group("target")) is not None
    )


def check_owned(out: Path) -> None:
    """Refuse an output folder that holds anything but a shardsmith dataset or what our builds left
    there. Reads only: a refused folder is not touched."""
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputError(f"--out {out} exists and is not a folder: pass a new or empty folder")
    shards = out / fmt.SHARDS_DIR
    if shards.is_symlink() and not inside(out, f"{fmt.SHARDS_DIR}/x"):
        # every shard is written, reused and deleted through this folder: a link leading out would
        # put the build's writes outside --out, where no name it reads back may lead
        raise OutputError(
            f"--out {out}: {fmt.SHARDS_DIR}/ is a link leading outside the folder (to "
            f"{os.path.realpath(shards)}): a build writes and deletes shards there, so it must be "
            "a folder inside --out; replace the link by a folder (nothing was changed)"
        )
    index = fmt.index_path(out)
    if index.exists() and _is_our_index(index):
        # a dataset: its other files are never deleted (only those its indexes and journals name)
        return
    owned = journaled(out)
    foreign = []
    for entry in sorted(out.iterdir()):
        name = entry.name
        if (
            name in FIXED
            or JOURNAL_RE.fullmatch(name)
            or SPILL_RE.fullmatch(name)
            or ATOMIC_TMP_RE.fullmatch(name)
            or name in owned
            or _temp_of(name, "", owned)
        ):
            continue
        if name == fmt.SHARDS_DIR and entry.is_dir():
            prefix = f"{fmt.SHARDS_DIR}/"
            foreign += [
                f"{prefix}{p.name}"
                for p in sorted(entry.iterdir())
                if prefix + p.name not in owned and not _temp_of(p.name, prefix, owned)
            ]
            continue
        foreign.append(name)
    if foreign:
        shown = ", ".join(foreign[:SHOWN]) + (
            f" and {len(foreign) - SHOWN} more" if len(foreign) > SHOWN else ""
        )
        what = "an index.json that is not a shardsmith index" if index.exists() else "no index.json"
        raise OutputError(
            f"--out {out} is not a shardsmith dataset ({what}) and is not empty: it holds {shown}. "
            "A build deletes files in its output folder, so it only writes into a new or empty "
            "folder or an existing dataset: pass another --out (nothing was changed)"
        )


def remove(out: Path, rel: str) -> bool:
    """Delete one of our files or folders (relative to ``out``); True if something was removed. A
    name that leads outside ``out`` is refused here too, whoever asks."""
    if not inside(out, rel):
        log.warning("%s: refusing to delete %r, which is not inside the dataset folder", out, rel)
        return False
    p = out / rel
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
        return True
    try:
        p.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        log.warning("could not remove %s (%s): a later build or `shardsmith gc` retries", p, e)
        return False


def temporaries(out: Path, owned: set[str]) -> list[str]:
    """Temporary files and folders of builds that are not running (the caller holds the lock): spill
    folders, half-written shards or tables of a file we own, atomic-write temp files."""
    found = [
        p.name
        for p in out.iterdir()
        if SPILL_RE.fullmatch(p.name)
        or ATOMIC_TMP_RE.fullmatch(p.name)
        or (JOURNAL_RE.fullmatch(p.name) is None and _temp_of(p.name, "", owned))
    ]
    shards = out / fmt.SHARDS_DIR
    if shards.is_dir():
        prefix = f"{fmt.SHARDS_DIR}/"
        found += [prefix + p.name for p in shards.iterdir() if _temp_of(p.name, prefix, owned)]
    return sorted(found)


def sweep(out: Path, index: fmt.Index | None, dead_builds: bool = True) -> list[str]:
    """Remove what no live generation names (the caller holds the lock): temporaries, the index's
    retired files and, with ``dead_builds``, the files journaled by builds that died, and their
    journals. A starting build passes False: it may reuse those files by name, and retires the
    rest at its commit."""
    keep = live(index)
    journal = journaled(out)
    retired = ours_only(
        out, index.retired if index is not None else [], "index.json's retired list"
    )
    doomed = temporaries(out, keep | retired | journal)
    doomed += sorted(
        f for f in (retired | (journal if dead_builds else set())) - keep if (out / f).exists()
    )
    removed = [f for f in doomed if remove(out, f)]
    if dead_builds:
        for p in journals(out):
            p.unlink(missing_ok=True)
    if removed:
        log.info("%s: removed %d leftover file(s) that no live generation names", out, len(removed))
    return removed


def next_generation(
    out: Path, prev: fmt.Index | None, new_files: Iterable[str]
) -> dict[str, object]:
    """The new index's generation fields: its number, the generation it keeps (``previous``) and the
    files it retires (every file we know is ours that neither names and that still exists).
    ``previous`` is the committed generation, unless that names exactly the new files (a rebuild
    that changed no shard, e.g. after a ``touch``): then the older one stays protected instead."""
    new_files = set(new_files)
    if prev is not None and set(prev.files()) == new_files:
        previous = _inside_only(out, prev.previous)
    else:
        previous = (
            None
            if prev is None
            else _inside_only(
                out,
                fmt.Generation(
                    prev.generation,
                    index_digest(out),
                    [s.file for s in prev.shards],
                    prev.conditions.file if prev.conditions is not None else None,
                ),
            )
        )
    keep = new_files | set(previous.files() if previous is not None else [])
    retired_before = ours_only(
        out, prev.retired if prev is not None else [], "index.json's retired list"
    )
    ours = ours_only(out, live(prev), "index.json") | journaled(out) | retired_before
    retired = sorted(f for f in ours - keep if (out / f).exists())
    return {
        "generation": (prev.generation if prev is not None else 0) + 1,
        "previous": previous,
        "retired": retired,
    }


def _inside_only(out: Path, gen: fmt.Generation | None) -> fmt.Generation | None:
    """``gen`` without the names that lead outside ``out``: the new index carries the generation it
    keeps, and a name a tampered index put there must not be carried on to later builds and gc."""
    if gen is None:
        return None
    cond = gen.conditions if gen.conditions is not None and inside(out, gen.conditions) else None
    shards = [s for s in gen.shards if shard_inside(out, s)]
    return fmt.Generation(gen.generation, gen.index_sha256, shards, cond)


def after_commit(out: Path, retired: Iterable[str]) -> int:
    """Delete what the committed index retired, then every journal (all their files are now either
    named by a live generation or retired). Interrupted: the index still lists them; the next
    build or gc finishes."""
    removed = sum(remove(out, f) for f in retired)
    for p in journals(out):
        p.unlink(missing_ok=True)
    return removed


def failed(out: Path, prev: fmt.Index | None, journal: Path | None, error: BaseException) -> None:
    """A build failed before its commit. Out of space (or read-only), or it kept no record (a rerun
    of the same input would write the same empty shards: nothing to adopt): delete the files it
    journaled that no live generation names, then its journal, so the disk gets its space back.
    Otherwise keep its finished shards and their journal: the rerun adopts them
    (`pipeline.resume`), or the next commit or gc retires them. Killed (no chance to run this):
    the journal stays, with the same effect."""
    if journal is None or not journal.exists():
        return
    keep = live(prev)
    try:
        named = ours_only(out, json.loads(journal.read_text())["files"], journal.name)
        files = [f for f in sorted(named) if f not in keep and (out / f).exists()]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if isinstance(error, NothingKeptError) or (
        isinstance(error, OSError) and _fails_the_output(out, error)
    ):
        for f in files:
            remove(out, f)
        files = []
    if not files:
        journal.unlink(missing_ok=True)


def _fails_the_output(out: Path, e: OSError) -> bool:
    """An OSError that means the output folder cannot take our writes (not, e.g., an unreadable
    source)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):
        return True
    if e.errno in (errno.EACCES, errno.EPERM) and e.filename:
        return Path(os.path.abspath(e.filename)).is_relative_to(os.path.abspath(out))
    return False


@contextmanager
def writing(out: Path, wait: float = 0.0, what: str = "build") -> Iterator[None]:
    """The one way to write into an output folder: refuse a folder that is not ours (before touching
    it), create it, hold its lock (`pipeline.lock`), and turn a full disk or read-only folder
    into a clear error."""
    check_owned(out)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(out, e, "creating the folder") from None
    with exclusive(out, wait, what):
        check_owned(out)  # again, now that no other build can be adding files
        try:
            yield
        except OSError as e:
            _drop_if_bare(out, created)
            if _fails_the_output(out, e):
                raise output_error(out, e, f"the {what} failed") from e
            raise
        except BaseException:
            _drop_if_bare(out, created)
            raise


def _drop_if_bare(out: Path, created: bool) -> None:
    """A first build failed before anything worth keeping (bad input, typically): leave ``out`` as
    it found it (no folder if it made it, else an empty one). Only an empty ``shards/`` and our
    lock file go; anything else (finished shards a rerun adopts, their journal) stays, and so
    does the folder. Unlinking the lock while holding it is safe: `exclusive` re-checks, after
    locking, that the path still names the file it locked."""
    if fmt.index_path(out).exists():
        return
    try:
        (out / fmt.SHARDS_DIR).rmdir()
    except OSError:
        pass  # absent, or holds shards
    try:
        if [p.name for p in out.iterdir()] == [LOCK_FILE]:
            (out / LOCK_FILE).unlink()
            if created:
                out.rmdir()
    except OSError:
        pass
