"""`shardsmith push LOCAL URL`: upload a committed dataset folder to object storage, with the local
generations rule (`pipeline.generations`) kept on the remote side.

Order is the contract: every object of the new generation is uploaded first, ``index.json`` last
(the commit point), so a reader never sees an index naming a missing object. A re-push uploads
only the objects the remote lacks or holds with another size, and every object of a file whose
entry in the remote index differs from the local one (another digest under the same name).

Remote generations: ``.shardsmith-push.json`` (the push record) names the files of the committed
generation, of the one before it (kept for readers that opened it), and every file a push wrote
or announced. After a commit, objects of files the record owns that neither live generation
names are retired (listed in the record first, then deleted: an interrupted cleanup is finished
by the next push). Objects under the prefix that no index or record of ours names are never
deleted. A file is the unit, as locally: a zarr shard ``shards/x.zarr`` owns every key below
``shards/x.zarr/``.

One pusher per prefix: ``.shardsmith-push.lock``, created with S3's conditional put
(``If-None-Match: *``) and read back (docs/REMOTE.md "Push lock": servers that ignore the header).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loaders import format as fmt
from loaders.format.names import plain_name
from loaders.remote.store import ObjectStore, RemoteNotFound, RetryPolicy, open_store
from pipeline.errors import DatasetError, LockHeldError, OutputError
from pipeline.writers import WRITERS

log = logging.getLogger(__name__)

LOCK_KEY = ".shardsmith-push.lock"
RECORD_KEY = ".shardsmith-push.json"
RECORD_FORMAT = "shardsmith-push"
STALE_S = 6 * 3600.0  # a lock older than this is reported as probably left by a killed push
POLL_S = 1.0  # how often a waiting push looks at the lock again
JOBS = 8  # concurrent uploads
# the stems of the files a build names (pipeline.model.ShardPlan.file, pipeline.planned
# .conditions_file); their suffix is a shard writer's (".zarr", ".tar")
SHARD_STEM_RE = re.compile(r"[a-z]+-\d{3,}-\d{3,}-[0-9a-f]{16}")
CONDITIONS_STEM_RE = re.compile(r"conditions-[0-9a-f]{16}")


@dataclass
class PushResult:
    url: str
    uploaded: list[str] = field(default_factory=list)  # keys written, index.json last
    unchanged: int = 0  # objects of the new generation already there
    deleted: list[str] = field(default_factory=list)  # keys of retired files
    bytes_uploaded: int = 0
    seconds: float = 0.0


def push(
    local: str | Path,
    url: str,
    wait: float = 0.0,
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    progress: bool = True,
    jobs: int = JOBS,
    store: ObjectStore | None = None,
    replace: bool = False,
) -> PushResult:
    """Upload the committed dataset in ``local`` to ``url`` (a dataset prefix); see the module
    docstring for what is uploaded, kept and deleted. ``wait``: seconds to wait for another
    push's lock before `LockHeldError` (exit 3). Another dataset (name or kind) at ``url`` is
    refused unless ``replace``, as a build refuses another dataset's folder."""
    t0 = time.perf_counter()
    local = Path(local)
    data = fmt.read_index_bytes(local)  # FormatError naming the folder when there is none
    index = fmt.read_index(local, data)
    store = store or open_store(url, storage_options, retry)
    files = index.files()
    objects = dict(_local_objects(local, files))
    res = PushResult(store.url)
    with remote_lock(store, wait):
        old_index = _remote_json(store, fmt.INDEX_FILE)
        _check_same_dataset(store, old_index, index, replace)
        record = _remote_json(store, RECORD_KEY) or {}
        listing = {o.key: o.size for o in store.list()}
        old_files = _index_files(old_index)
        changed = _changed_files(index.raw, old_index)
        todo = [
            k
            for k, (_, size) in objects.items()
            if listing.get(k) != size or _file_of(k, files) in changed
        ]
        res.unchanged = len(objects) - len(todo)
        owned = _ours_only(
            store,
            set(record.get("owned", []))
            | set(record.get("retired", []))  # a cleanup that was interrupted
            | old_files
            | set(_previous_files(record)),
        )
        # announce before writing: a push killed half-way leaves these files owned (a journal)
        _put_record(store, record, owned=owned | set(files))
        res.bytes_uploaded = _upload(store, [(k, objects[k][0]) for k in todo], progress, jobs)
        res.uploaded = sorted(todo)
        if todo or old_index != index.raw:  # a push that changes nothing uploads nothing
            store.put(fmt.INDEX_FILE, data)  # the commit point
            res.uploaded.append(fmt.INDEX_FILE)
        current = sorted(files)
        previous = record.get("previous") if set(old_files) == set(files) else sorted(old_files)
        keep = set(current) | set(previous or [])
        retired = sorted(owned - keep)
        _put_record(store, record, current=current, previous=previous, owned=keep, retired=retired)
        res.deleted = _delete_files(store, retired, listing)
        if res.deleted or record.get("retired"):
            _put_record(store, record, retired=[])
    res.seconds = time.perf_counter() - t0
    log.info(
        "pushed %s to %s: %d uploaded, %d unchanged, %d deleted",
        local,
        store.url,
        len(res.uploaded),
        res.unchanged,
        len(res.deleted),
    )
    return res


def _check_same_dataset(
    store: ObjectStore, old: Mapping[str, Any] | None, index: fmt.Index, replace: bool
) -> None:
    """A copied command line pushing one dataset over another would retire all its objects."""
    if replace or not old:
        return
    held = (str(old.get("name")), str(old.get("kind")))
    if held != (index.name, index.kind):
        raise OutputError(
            f"{store.url} holds dataset {held[0]!r} (kind {held[1]}), and {index.root} is dataset "
            f"{index.name!r} (kind {index.kind}): a push there would replace it. Push to another "
            "prefix, or pass --replace to replace it (nothing was changed)"
        )


def _ours_only(store: ObjectStore, names: Iterable[object]) -> set[str]:
    """The names read back from the remote (index, record) that name a file the way a build names
    them: ``shards/<shard>`` (``<split>-NNN-NNN-<16 hex>`` and a writer's suffix) or the condition
    table beside index.json (exactly ``conditions-<16 hex>`` and a writer's suffix). Anything
    else, which a tampered record could carry to delete what is not ours (``shards``, ``..``,
    ``notes``, ``notes-001-001-<hex>.txt`` or ``conditions-<hex>.csv`` at the top of the prefix),
    is logged and dropped: never deleted."""
    kept: set[str] = set()
    dropped: list[object] = []
    for n in names:
        if isinstance(n, str) and _deletable(n):
            kept.add(n)
        else:
            dropped.append(n)
    if dropped:
        log.warning(
            "%s: ignoring %d name(s) in the remote index or push record that are not a dataset "
            "file's (never deleted): %s",
            store.url,
            len(dropped),
            ", ".join(map(repr, dropped[:5])),
        )
    return kept


def _deletable(name: str) -> bool:
    """Whether ``name`` has the shape of a file an index of ours names (see ``_ours_only``)."""
    parts = name.split("/")
    stem, dot, suffix = parts[-1].rpartition(".")
    suffixes = {WRITERS.get(encoding).suffix for encoding in WRITERS.names()}
    if not dot or not plain_name(parts[-1]) or f".{suffix}" not in suffixes:
        return False
    if len(parts) == 2 and parts[0] == fmt.SHARDS_DIR:
        return bool(SHARD_STEM_RE.fullmatch(stem))
    return len(parts) == 1 and bool(CONDITIONS_STEM_RE.fullmatch(stem))


def _local_objects(root: Path, files: Iterable[str]) -> Iterator[tuple[str, tuple[Path, int]]]:
    """(key, (path, size)) for every object of ``files``: a file is one object, a folder (a zarr
    store) one object per file below it, with the same relative paths."""
    for rel in files:
        p = root / rel
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file():
                    yield f.relative_to(root).as_posix(), (f, f.stat().st_size)
        elif p.is_file():
            yield rel, (p, p.stat().st_size)
        else:
            raise DatasetError(
                f"{root}: index.json names {rel}, which is missing: rebuild the dataset "
                "(`shardsmith build MANIFEST --out DIR`) or run `shardsmith verify`; "
                "nothing was pushed"
            )


def _file_of(key: str, files: list[str]) -> str:
    for f in files:
        if key == f or key.startswith(f + "/"):
            return f
    return key


def _entries(doc: Mapping[str, Any] | None) -> dict[str, Any]:
    """file -> its index entry (shards and the condition table): what says which bytes it holds."""
    if not doc:
        return {}
    out = {
        f"{fmt.SHARDS_DIR}/{s['file']}": s
        for s in doc.get("shards", [])
        if isinstance(s, dict) and "file" in s
    }
    cond = doc.get("conditions")
    if isinstance(cond, dict) and "file" in cond:
        out[str(cond["file"])] = cond
    return out


def _changed_files(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> set[str]:
    """Files the remote index names with another entry (digest, size) than the local one."""
    before = _entries(old)
    return {f for f, e in _entries(new).items() if f in before and before[f] != e}


def _index_files(doc: Mapping[str, Any] | None) -> set[str]:
    return set(_entries(doc))


def _previous_files(record: Mapping[str, Any]) -> list[str]:
    return [*record.get("current", []), *(record.get("previous") or [])]


def _remote_json(store: ObjectStore, key: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(store.get(key))
    except RemoteNotFound:
        return None
    except ValueError:
        log.warning("%s is not JSON: ignored (it is replaced by this push)", store.key_url(key))
        return None
    return doc if isinstance(doc, dict) else None


def _put_record(store: ObjectStore, record: dict[str, Any], **changes: Any) -> None:
    """Update the push record (in place, and on the remote)."""
    before = dict(record)
    record.update(changes, format=RECORD_FORMAT, version=1)
    for k in ("owned", "current", "retired"):
        record[k] = sorted(set(record.get(k) or []))
    if record != before:  # as read from the remote, or as this push last wrote it
        store.put(RECORD_KEY, json.dumps(record, sort_keys=True, indent=1).encode())


def _upload(store: ObjectStore, items: list[tuple[str, Path]], progress: bool, jobs: int) -> int:
    if not items:
        return 0
    from tqdm import tqdm  # import weight: only a push with something to upload draws a bar

    total = sum(p.stat().st_size for _, p in items)
    with (
        tqdm(total=total, unit="B", unit_scale=True, desc="push", disable=not progress) as bar,
        ThreadPoolExecutor(max(1, jobs)) as pool,
    ):
        for n in pool.map(lambda kp: store.put_file(*kp), items):
            bar.update(n)
    return total


def _delete_files(store: ObjectStore, files: list[str], listing: Mapping[str, int]) -> list[str]:
    """Delete every object of ``files`` (a file, or the keys below a folder's name)."""
    keys = sorted(k for k in listing for f in files if k == f or k.startswith(f + "/"))
    for k in keys:
        store.delete(k)
    return keys


# -- the lock -----------------------------------------------------------------------------------
@contextmanager
def remote_lock(store: ObjectStore, wait: float = 0.0) -> Iterator[None]:
    """Hold ``.shardsmith-push.lock`` under the prefix for the ``with`` block: looked for, created
    only if absent (conditional put), then read back, so that on a server ignoring the condition
    only two pushes starting within the same few milliseconds can both run. Another holder:
    ``LockHeldError`` at once, or after ``wait`` seconds. A killed push leaves the lock: after
    STALE_S the error says so and how to remove it (never removed automatically: a slow push is
    not a dead one)."""
    token = uuid.uuid4().hex
    note = {
        "token": token,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.time(),
        "url": store.url,
    }
    deadline = time.monotonic() + max(0.0, wait)
    while True:
        if (
            store.head(LOCK_KEY) is None  # a server that ignores If-None-Match: no overwrite
            and store.put_if_absent(LOCK_KEY, json.dumps(note).encode())
            and _ours(store, token)
        ):
            break
        if time.monotonic() >= deadline:
            raise LockHeldError(_held_message(store, wait))
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    try:
        yield
    finally:
        if _ours(store, token):
            store.delete(LOCK_KEY)


def _ours(store: ObjectStore, token: str) -> bool:
    try:
        return json.loads(store.get(LOCK_KEY)).get("token") == token
    except (RemoteNotFound, ValueError, AttributeError):
        return False


def _held_message(store: ObjectStore, wait: float) -> str:
    lock_url = store.key_url(LOCK_KEY)
    try:
        held = json.loads(store.get(LOCK_KEY))
        age = time.time() - float(held["since"])
        who = f"pid {held['pid']} on {held['host']}, {age:.0f} s ago"
    except (RemoteNotFound, ValueError, KeyError, TypeError):
        age, who = 0.0, "another push"
    waited = f" (waited {wait:g} s)" if wait > 0 else ""
    stale = (
        f" The lock is {age / 3600:.1f} h old: if no push is running (it was killed), remove it "
        f"(`aws s3 rm {lock_url}`) and push again."
        if age > STALE_S
        else " Wait for it, or pass --wait SECONDS."
    )
    return f"cannot push to {store.url}: another push holds {lock_url}{waited}: {who}.{stale}"
