"""The node-local cache of a remote dataset: each shard object downloaded once per node, whole,
shared by every rank, DataLoader worker and decoder process of the node (docs/REMOTE.md).

Why whole shards in local files: the reading code (``loaders.format.integrity``, the decoder process)
takes local paths and reads a shard's files once into memory; a cache folder laid out as the
dataset folder (``<cache_dir>/<url hash>/<index digest>/index.json`` + ``shards/``) keeps that code
unchanged, and a shard is downloaded once for all epochs and all processes.

Processes coordinate through ``flock`` only (released by the kernel when a process dies, so a
crash never leaves a lock behind), per shard, in ``<root>/.pins/``:

* ``<name>.dl``: held exclusively while the shard is downloaded (to a temporary name, checked
  against the index's digest, then renamed: a reader sees a whole, checked shard or none);
* ``<name>.pin``: held shared by every process that needs the shard soon (the window it decodes,
  the windows it prefetches). Its content is the shard's bytes in the cache (0: not cached), its
  mtime the last use: together the ledger that eviction reads. An evictor takes it exclusively
  without waiting, so a pinned shard is never evicted.

A limit (``cache_limit``) is enforced under one lock for the whole cache folder, when a download
is reserved: the least recently used unpinned shards go first.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from loaders.format import index_sha256
from loaders.format.errors import FormatError
from loaders.format.files import atomic_write_bytes, shard_digest_matches
from loaders.format.integrity import DatasetRebuilt
from loaders.format.names import plain_name
from loaders.format.values import ShardEntry
from loaders.remote.download import download_tree
from loaders.remote.ledger import PINS, evict, locked, remove_path, touch, write_size
from loaders.remote.reuse import adopt_from_other_generation
from loaders.remote.store import ObjectStore, RemoteError, RemoteNotFound, open_store
from loaders.remote.threads import DaemonExecutor

THREADS = 8  # concurrent downloads per process (one connection each)
TMP, LOCK = ".tmp", ".shardsmith-cache.lock"
WAIT_S = 60.0  # how long a download waits for pinned space to free up before giving up


class CacheError(FormatError):
    """The cache cannot hold or fetch a shard (disk full, limit too small, a bad object)."""


@dataclass
class NodeCache:
    """One remote dataset's cache folder ``root`` (``<cache_dir>/<url hash>/<index digest>``) on
    this node. Build one per process (:func:`node_cache`); nothing here crosses a fork."""

    url: str
    root: Path
    cache_dir: Path
    encoding: str
    limit: int | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    downloads: int = 0  # shard objects this process downloaded (GETs of whole shards)
    reused: int = 0  # shards taken from another generation's folder instead (loaders.remote.reuse)
    _store: ObjectStore | None = None

    def __post_init__(self) -> None:
        self.root, self.cache_dir = Path(self.root), Path(self.cache_dir)
        (self.root / PINS).mkdir(parents=True, exist_ok=True)
        (self.root / "shards").mkdir(parents=True, exist_ok=True)
        self._pool: Executor | None = None  # daemon threads: an exit never waits on a prefetch
        # prefetch pins, per reader (a train and a val dataset of one URL pin their own windows):
        # owner -> shard file -> fd holding LOCK_SH
        self._held: dict[int, dict[str, int]] = {}
        self._turns: dict[int, int] = {}  # owner -> its latest prefetch call (older chains stop)
        self._jobs: dict[str, Future[None]] = {}
        self._bad: dict[str, CacheError] = {}  # shards whose object failed its digest twice
        self._lock = threading.RLock()
        self._objects: Executor | None = None  # a zarr shard's objects, in parallel

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = open_store(self.url, self.storage_options)
        return self._store

    # -- paths ------------------------------------------------------------------------------------
    def path(self, entry: ShardEntry) -> Path:
        """Where ``entry`` is cached. Its name was checked where index.json was parsed
        (``loaders.format.names``); checked again here, as a path, so that no way round that parser (an
        entry built in code, a later change) can download or rename outside the cache folder."""
        path = self.root / "shards" / entry.file
        if not (plain_name(entry.file) and path.resolve().is_relative_to(self.cache_dir.resolve())):
            raise CacheError(
                f"{self.url}: shard name {entry.file!r} would be cached at {path}, outside the "
                f"cache folder {self.cache_dir}: refused (the dataset's index.json is not one "
                "shardsmith wrote)"
            )
        return path

    def _pin_path(self, entry: ShardEntry, suffix: str) -> Path:
        return self.root / PINS / f"{quote(entry.file, safe='')}{suffix}"

    def cached(self, entry: ShardEntry) -> bool:
        return self.path(entry).exists()

    # -- use --------------------------------------------------------------------------------------
    @contextmanager
    def ready(self, entries: Iterable[ShardEntry]) -> Iterator[None]:
        """Within the block, every shard of ``entries`` is in the cache, whole and checked, and
        pinned (no process evicts it): a window decodes from local files, then lets them go."""
        entries = list(entries)
        fds = [self._pin(e) for e in entries]
        try:
            self._run(entries)
            yield
        finally:
            for fd in fds:
                os.close(fd)

    def prefetch(self, windows: list[list[ShardEntry]], owner: int = 0) -> None:
        """Download the shards of ``windows`` (in the order this process reads them) in the
        background, one window after the other so the nearest is whole first, and keep them
        pinned until ``owner``'s next call (a reader: one dataset's windows never unpin
        another's); shards pinned by its previous call and not named now are let go (evictable,
        least recently used first)."""
        names = {e.file for w in windows for e in w}
        with self._lock:
            held = self._held.setdefault(owner, {})
            for name in [n for n in held if n not in names]:
                os.close(held.pop(name))
            for e in (e for w in windows for e in w):
                if e.file not in held:
                    held[e.file] = self._pin(e)
            turn = self._turns[owner] = self._turns.get(owner, 0) + 1
        self._chain(windows, owner, turn)

    def release(self, owner: int) -> None:
        """``owner`` reads no more (its dataset was dropped): its pins go, its chain starts no
        further window, and downloads queued for no other owner are cancelled (one running
        finishes). Without this a dropped reader's read-ahead kept the link busy for seconds."""
        with self._lock:
            self._turns[owner] = self._turns.get(owner, 0) + 1
            for fd in self._held.pop(owner, {}).values():
                os.close(fd)
            wanted = {n for held in self._held.values() for n in held}
            for name, job in list(self._jobs.items()):
                if name not in wanted:
                    job.cancel()

    def _chain(self, windows: list[list[ShardEntry]], owner: int = 0, turn: int = 0) -> None:
        """Start the first window's downloads; the next window's when they are all done, unless
        ``owner`` has asked again since (a newer chain, from its next window, goes on) or
        was released."""
        if not windows or self._turns.get(owner, 0) != turn:
            return
        try:
            with self._lock:
                pending = [self._job(e) for e in windows[0]]
        except RuntimeError:  # the interpreter is exiting (no new threads): nothing to prefetch for
            return
        pending = [f for f in pending if f is not None and not f.done()]
        if not pending:
            return self._chain(windows[1:], owner, turn)
        left = [len(pending)]

        def done(_f: Future[None]) -> None:
            with self._lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._chain(windows[1:], owner, turn)

        for f in pending:
            f.add_done_callback(done)

    def _job(self, entry: ShardEntry) -> Future[None] | None:
        """The running download of ``entry`` (started now if none is), None when cached."""
        if self.cached(entry):
            return None
        job = self._jobs.get(entry.file)
        if job is None or job.done():
            job = self._jobs[entry.file] = self._executor().submit(self._fetch, entry)
        return job

    def forget(self) -> None:
        """In a forked child: close the parent's pins (the child's copies would keep them held
        for as long as it lives) without touching the locks, which the parent still holds."""
        for fd in (fd for held in self._held.values() for fd in held.values()):
            os.close(fd)
        self._held.clear()
        self._turns.clear()
        self._jobs.clear()
        self._pool = self._objects = None
        self._lock = threading.RLock()

    def _executor(self) -> Executor:
        if self._pool is None:
            self._pool = DaemonExecutor(THREADS, "shard-fetch")
        return self._pool

    def _run(self, entries: list[ShardEntry]) -> None:
        """Fetch the missing ones, in parallel; the first failure is raised (naming its object).
        A shard a prefetch of this process is downloading is waited for, and when the server
        failed it (a `RemoteError`: its retry bound spent) that is this read's error: downloading
        it again would double the wait for the first error (issue 45, item 8: 240 s where the
        retry bound was 120). A local failure of the prefetch (the cache folder removed under it)
        is left to this read's own download, which makes the folder again."""
        missing = [e for e in entries if not self.cached(e)]
        with self._lock:
            running = {e.file: j for e in missing if (j := self._jobs.get(e.file)) and not j.done()}
        if len(missing) <= 1 and not running:
            for e in missing:
                self._fetch(e)
            return
        for fut in [self._executor().submit(self._after, e, running.get(e.file)) for e in missing]:
            fut.result()

    def _after(self, entry: ShardEntry, prefetch: Future[None] | None) -> None:
        """``entry`` in the cache, after the prefetch downloading it (if any) ends: its server
        error raised as is, anything else left to :meth:`_fetch` (a no-op once it is cached)."""
        if prefetch is not None:
            try:
                prefetch.result()
            except RemoteError:
                raise
            except Exception:  # a local failure (the folder removed...): this read tries again
                pass
        self._fetch(entry)

    def _pin(self, entry: ShardEntry) -> int:
        fd = self._open_ledger(entry, ".pin")
        fcntl.flock(fd, fcntl.LOCK_SH)
        touch(fd)
        return fd

    def _open_ledger(self, entry: ShardEntry, suffix: str) -> int:
        """An fd on ``entry``'s pin (``.pin``) or download lock (``.dl``). A cache folder removed
        under a running reader (``rm -rf`` of the cache, a tmp cleaner) is made again first: the
        shards it held are downloaded again as they are needed."""
        path = self._pin_path(entry, suffix)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:
            self._recreate()
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)

    def _recreate(self) -> None:
        """The generation folder's ``.pins/`` and ``shards/`` made again, and its ``index.json``
        put back when the remote still holds the opened generation (a reader's rebuilt check
        reads it); a folder that cannot be made is a :class:`CacheError` saying so."""
        try:
            for sub in (PINS, "shards"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            if not (self.root / "index.json").exists():
                data = self.store.get("index.json")
                if index_sha256(data).startswith(self.root.name):
                    atomic_write_bytes(self.root / "index.json", data)
        except RemoteError:
            pass  # unreachable now: a shard's own download says so
        except OSError as e:
            raise CacheError(
                f"cache folder {self.cache_dir} was removed while {self.url} was being read and "
                f"cannot be made again ({e.strerror or e}): restore it, or choose another "
                "cache_dir= / $SHARDSMITH_CACHE and restart"
            ) from None

    def refetch(self, entry: ShardEntry) -> None:
        """``entry``'s cached copy failed its check on read. It was checked when it was
        downloaded, so this node's copy changed since (a disk error, an edit, a file deleted):
        removed and downloaded again (the caller holds its pin; the download is checked)."""
        fd = self._open_ledger(entry, ".dl")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            remove_path(self.path(entry))
        finally:
            os.close(fd)
        self._fetch(entry)

    # -- download ---------------------------------------------------------------------------------
    def _fetch(self, entry: ShardEntry) -> None:
        """The shard in the cache: downloaded here unless another thread or process did it (they
        wait on its download lock); the caller holds its pin."""
        if self.cached(entry):
            return
        if entry.file in self._bad:  # a prefetch found it bad: the same error, no third download
            raise self._bad[entry.file]
        fd = self._open_ledger(entry, ".dl")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self.cached(entry):
                return
            if entry.file in self._bad:  # found bad while this thread waited
                raise self._bad[entry.file]
            try:  # the ledger's writes too: on a full disk its entry is the first write to fail
                self._reserve(entry)
                try:
                    size = self._download_checked(entry)
                except RemoteNotFound as e:
                    write_size(self._pin_path(entry, ".pin"), 0)
                    raise self._gone(e) from None
                except BaseException:
                    write_size(self._pin_path(entry, ".pin"), 0)
                    raise
                self._record(entry, size)
            except OSError as e:
                raise self._disk_error(e, entry) from None
        finally:
            os.close(fd)

    def _record(self, entry: ShardEntry, size: int) -> None:
        """The downloaded shard's size in its ledger entry, under the folder's lock when there is
        a limit: rewriting an entry truncates it first, and an evictor reading it meanwhile (a
        reservation on another thread) took it for empty, left it out of the bytes held and let
        one shard too many in (the eviction test saw 4 shards under a limit of 3, once, under
        load)."""
        with nullcontext() if self.limit is None else locked(self.cache_dir / LOCK):
            write_size(self._pin_path(entry, ".pin"), size)

    def _download_checked(self, entry: ShardEntry) -> int:
        """Download to a temporary name, check the digest (one retry), rename; its bytes."""
        tmp_dir = self.root / TMP
        tmp_dir.mkdir(exist_ok=True)
        for stale in tmp_dir.glob(f"{glob.escape(quote(entry.file, safe=''))}.*"):
            remove_path(stale)  # a process killed mid-download (this one holds the lock now)
        if entry.digest and self._reuse(entry, tmp_dir):
            return max(0, int(entry.bytes))
        problem = ""
        for _attempt in range(2):
            tmp = tmp_dir / f"{quote(entry.file, safe='')}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            try:
                size = self._download(entry, tmp)
                if not entry.digest or shard_digest_matches(entry, tmp):
                    os.rename(tmp, self.path(entry))
                    self.downloads += 1
                    return size
                problem = "its bytes do not match the digest in index.json"
            except OSError as e:
                raise self._disk_error(e, entry) from None
            finally:
                remove_path(tmp)
        self._bad[entry.file] = CacheError(
            f"{self.store.key_url('shards/' + entry.file)}: downloaded twice, {problem} (the "
            f"object was changed or damaged after the push): push the dataset again, or run "
            f"`shardsmith verify {self.url}`"
        )
        raise self._bad[entry.file]

    def _gone(self, missing: RemoteNotFound) -> FormatError:
        """A shard object of the opened generation that is not there: the dataset was pushed
        again since (``index.json`` changed; a push deletes the generation before the previous
        one), so :class:`DatasetRebuilt`, as for a local folder rebuilt under a reader; else the
        not-found error itself (an object deleted by hand)."""
        try:
            now = index_sha256(self.store.get("index.json"))
        except RemoteError:
            return missing
        if now.startswith(self.root.name):
            return missing
        return DatasetRebuilt(
            f"{missing.url}: gone, because {self.url} was pushed again since this reader opened "
            f"it (index.json is {now[:16]}... now): open the dataset again to read the new "
            "generation (a new ShardDataset, or restart the run)"
        )

    def _reuse(self, entry: ShardEntry, tmp_dir: Path) -> bool:
        """The shard from another generation's folder of this URL on this node, if one holds it
        with the digest this index gives it (checked here, as a download is)."""
        tmp = tmp_dir / f"{quote(entry.file, safe='')}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        try:
            if adopt_from_other_generation(self.root, entry.file, tmp) and shard_digest_matches(
                entry, tmp
            ):
                os.rename(tmp, self.path(entry))
                self.reused += 1
                return True
        except OSError as e:
            raise self._disk_error(e, entry) from None
        finally:
            remove_path(tmp)
        return False

    def _download(self, entry: ShardEntry, tmp: Path) -> int:
        if self._objects is None and self.encoding == "zarr":
            self._objects = DaemonExecutor(THREADS, "shard-object")
        return download_tree(
            self.store,
            f"shards/{entry.file}",
            tmp,
            folder=self.encoding == "zarr",
            named_by=f"index.json names {entry.file}",
            pool=self._objects,
        )

    def _disk_error(self, e: OSError, entry: ShardEntry) -> CacheError:
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        what = "is full" if full else f"cannot be written ({e.strerror or e})"
        fix = "free space, set cache_limit=, or choose another cache_dir= / $SHARDSMITH_CACHE"
        return CacheError(
            f"cache folder {self.cache_dir} {what} while downloading "
            f"{self.store.key_url('shards/' + entry.file)}; nothing partial was kept: {fix}"
        )

    # -- the limit --------------------------------------------------------------------------------
    def _reserve(self, entry: ShardEntry) -> None:
        """Room for ``entry`` under the limit, least recently used unpinned shards evicted first
        (of any dataset in this cache folder); waits up to WAIT_S for pinned shards to go."""
        need = max(0, int(entry.bytes))
        if self.limit is None:
            write_size(self._pin_path(entry, ".pin"), need)
            return
        deadline = time.monotonic() + WAIT_S
        while True:
            with locked(self.cache_dir / LOCK):
                used, pinned = evict(self.cache_dir, self.limit - need)
                if used + need <= self.limit:
                    write_size(self._pin_path(entry, ".pin"), need)
                    return
            if time.monotonic() > deadline:
                raise CacheError(
                    f"cache folder {self.cache_dir}: {entry.file} ({need} bytes) does not fit "
                    f"under cache_limit={self.limit}: {pinned} bytes are pinned by the windows "
                    "in flight of the processes on this node; raise cache_limit (or use fewer "
                    "ranks per node, a smaller window)"
                )
            time.sleep(0.2)
