"""A dataset URL as a local folder: ``index.json`` fetched now, shards on demand into the node's
cache (:mod:`loaders.remote.cache`).

Why a local folder: every reader of shardsmith (the loader, its decoder process, ``verify``)
takes a dataset folder; a URL resolves to ``<cache_dir>/<url hash>/<index digest>/`` holding the
index the loader opened, so the same code reads it, and a cache folder of another dataset or of
another generation of this one is a different folder (never confused with this one).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaders.format import FormatError, index_sha256, read_index
from loaders.format.files import atomic_write_bytes, shard_digest_matches
from loaders.format.names import plain_name
from loaders.remote.cache import CacheError, NodeCache
from loaders.remote.download import download_tree
from loaders.remote.ledger import remove_path
from loaders.remote.node_index import check_offline, fetch_index
from loaders.remote.store import RemoteError, RemoteNotFound, is_url, local_path, open_store
from loaders.remote.threads import DaemonExecutor

CACHE_ENV = "SHARDSMITH_CACHE"
# (pid, root, limit) -> this process's cache of that folder
_CACHES: dict[tuple[int, str, int | None], NodeCache] = {}
_SIDE: dict[str, Future[None]] = {}  # generation folder -> its condition table, downloading
_SIDE_POOL: DaemonExecutor | None = None


def _after_fork() -> None:
    """A DataLoader worker starts with no cache of its parent's: their pins closed, dropped."""
    global _SIDE_POOL
    for cache in _CACHES.values():
        cache.forget()
    _CACHES.clear()
    _SIDE.clear()
    _SIDE_POOL = None


os.register_at_fork(after_in_child=_after_fork)


def default_cache_dir() -> Path:
    """``$SHARDSMITH_CACHE``, else the platform's user cache folder + ``shardsmith``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "shardsmith"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardsmith"


@dataclass(frozen=True)
class RemoteDataset:
    """A URL opened: its local cache folder and the JSON-able spec every process rebuilds its
    :class:`NodeCache` from (``WindowReader``'s ``spec["remote"]``)."""

    root: Path
    spec: dict[str, Any]
    store: Any = None  # the store that fetched index.json: this process's cache reuses its client


def open_remote(
    url: str,
    cache_dir: str | Path | None = None,
    cache_limit: int | None = None,
    storage_options: dict[str, Any] | None = None,
    trust_plugins: bool | Sequence[str] = False,
    offline: bool = False,
    split: str | None = None,
) -> RemoteDataset:
    """Fetch ``url``'s index.json (it is the commit point: once per node for the ranks of one
    job, :mod:`loaders.remote.node_index`) into its cache folder, and the condition table it
    names, on a thread (the caller waits with :func:`side_files_ready`); shards come
    later, per window. Without the server (unreachable, or ``offline=True``) the node's last copy
    opens when every shard of ``split`` is cached. Errors name the URL and the fix."""
    url = url.rstrip("/")
    if cache_limit is not None and int(cache_limit) < 0:
        raise ValueError(f"cache_limit={cache_limit}: expected bytes >= 0, or None (no limit)")
    cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    store = open_store(url, storage_options)
    url_dir = cache_dir / hashlib.sha256(url.encode()).hexdigest()[:16]

    def store_copy(data: bytes) -> str:
        digest = index_sha256(data)
        (url_dir / digest[:32]).mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(url_dir / "url.txt", (url + "\n").encode())
        if not (url_dir / digest[:32] / "index.json").is_file():
            atomic_write_bytes(url_dir / digest[:32] / "index.json", data)
        return digest

    try:
        fetched = fetch_index(store, url_dir, offline, store_copy)
    except RemoteNotFound as e:
        raise RemoteError(
            store.key_url("index.json"),
            f"no index.json ({e.problem})",
            "check the URL (a dataset's prefix, as given to `shardsmith push`), or push one there",
        ) from None
    except OSError as e:
        raise FormatError(
            f"cache folder {cache_dir} for {url}: cannot be written ({e.strerror or e}): pass "
            f"cache_dir= or set ${CACHE_ENV} to a writable folder"
        ) from None
    root = url_dir / index_sha256(fetched.data)[:32]
    index = read_index(root, fetched.data, trust_plugins)
    if fetched.how == "offline":
        missing = [
            e.file
            for e in index.shards
            if (split is None or e.split == split) and not (root / "shards" / e.file).exists()
        ]
        if index.conditions is not None and not (root / index.conditions.file).exists():
            missing.append(index.conditions.file)
        check_offline(fetched, url, offline, missing, split)
    spec = {
        "url": url,
        "cache_dir": str(cache_dir),
        "limit": None if cache_limit is None else int(cache_limit),
        "storage_options": dict(storage_options or {}),
        "encoding": index.encoding,
    }
    if index.conditions is not None:
        job = _SIDE.get(str(root))
        if job is None or job.done():  # one download per process (they share a temporary name)
            args = (store, root, index.conditions.file, index.conditions)
            _SIDE[str(root)] = _side_pool().submit(_fetch_side_file, *args)
    return RemoteDataset(root, spec, store)


def _side_pool() -> DaemonExecutor:
    global _SIDE_POOL
    if _SIDE_POOL is None:
        _SIDE_POOL = DaemonExecutor(2, "side-file")
    return _SIDE_POOL


def side_files_ready(root: str | Path) -> None:
    """The files beside ``root``'s index.json that :func:`open_remote` is downloading are in
    (their download's error raised here). A dataset's open starts its first windows' downloads
    before it waits here: they were queued behind the condition table (1.2 MB: 0.1 s of a
    100 Mbit link, sequential requests) and their listings' latency."""
    job = _SIDE.pop(str(root), None)
    if job is not None:
        job.result()


def _fetch_side_file(store: Any, root: Path, name: str, ref: Any) -> None:
    """A file beside index.json (the condition table: one object, or a zarr folder of them),
    checked against its digest, written atomically. ``name`` was checked where index.json was
    parsed; checked again here, where it becomes a path."""
    if not plain_name(name):
        raise CacheError(f"{root}: index.json names the file {name!r} beside it: not a plain name")
    dst = root / name
    if dst.exists():
        return
    tmp = root / f".{name}.{os.getpid()}.tmp"
    try:
        folder = store.head(name) is None  # one object, or a zarr folder of them
        download_tree(store, name, tmp, folder, named_by=f"index.json names {name}")
        if ref.digest and not shard_digest_matches(ref, tmp):
            raise RemoteError(
                store.key_url(name), "does not match its digest in index.json", "push again"
            )
        try:
            os.replace(tmp, dst)
        except OSError:
            if not dst.exists():  # else another process of the node renamed its copy first
                raise
    finally:
        remove_path(tmp)


def node_cache(spec: dict[str, Any], root: str | Path) -> NodeCache:
    """This process's cache of the dataset folder ``root`` (made after a fork or in a fresh
    decoder process from the JSON spec: no client or thread crosses processes)."""
    key = (os.getpid(), str(root), spec.get("limit"))
    cache = _CACHES.get(key)
    if cache is None:
        cache = NodeCache(
            url=spec["url"],
            root=Path(root),
            cache_dir=Path(spec["cache_dir"]),
            encoding=spec["encoding"],
            limit=spec.get("limit"),
            storage_options=dict(spec.get("storage_options") or {}),
        )
        _CACHES[key] = cache
    return cache


def resolve_root(
    root: str | Path,
    cache_dir: str | Path | None,
    cache_limit: int | None,
    storage_options: dict[str, Any] | None,
    trust_plugins: bool | Sequence[str] = False,
    offline: bool = False,
    split: str | None = None,
    wait: bool = True,
) -> tuple[str, Path, dict[str, Any] | None]:
    """``(what the user named, the local folder to read, the remote spec or None)``: a URL is
    opened into its cache folder; a local folder is read in place (never cached, never evicted).
    Without ``wait``, the files beside index.json may still be downloading: the caller calls
    :func:`side_files_ready` (after starting its first windows' downloads)."""
    if not is_url(root):
        if cache_dir is not None or cache_limit is not None or storage_options or offline:
            raise ValueError(
                f"{root}: cache_dir=, cache_limit=, storage_options= and offline= apply to a dataset URL "
                "(s3://...); a local folder is read in place"
            )
        return str(root), local_path(root), None
    remote = open_remote(
        str(root), cache_dir, cache_limit, storage_options, trust_plugins, offline, split
    )
    cache = node_cache(remote.spec, remote.root)
    if cache._store is None:  # one client per process, not one per use
        cache._store = remote.store
    if wait:
        side_files_ready(remote.root)
    return str(root).rstrip("/"), remote.root, remote.spec


def fetch_dataset(
    path: str | Path,
    splits: list[str] | None = None,
    shards: bool = True,
    cache_dir: str | Path | None = None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[Path, list[str]]:
    """The local folder of a dataset given as a path or URL, for the commands (``verify``,
    ``inspect``, ``export``): a URL's index and, with ``shards``, its shards (of ``splits``, or
    all) fetched into the node cache. Returns ``(folder, problems)``: a shard object that fails
    its digest is a problem (verify reports it), never a cached file."""
    if not is_url(path):
        return local_path(path), []
    remote = open_remote(str(path), cache_dir, None, storage_options)
    side_files_ready(remote.root)
    if not shards:
        return remote.root, []
    index = read_index(remote.root)
    cache = node_cache(remote.spec, remote.root)
    problems = []
    for entry in index.shards:
        if splits is None or entry.split in splits:
            try:
                with cache.ready([entry]):
                    if not shard_digest_matches(entry, cache.path(entry)):
                        cache.refetch(entry)  # checked when downloaded: changed on this node
            except RemoteNotFound as e:
                problems.append(f"{e.url}: shard object missing ({e.problem})")
            except CacheError as e:
                problems.append(str(e))
    return remote.root, problems
