"""One dataset prefix in object storage as a key -> bytes store, over the client of
`loaders.remote.s3`. Push (`pipeline.push`) and the remote reader (`loaders.remote.cache`) use it.

Why boto3 (the ``remote`` extra), measured against obstore and s3fs (docs/REMOTE.md "Client
choice", benchmarks/experiments/remote/remote_clients.py): obstore was the fastest and lightest, but a client made in
a forked child hangs once the parent has used obstore (its tokio runtime is process-wide and not
rebuilt after fork), and a trainer opens the dataset and then forks DataLoader workers; s3fs works
after fork but costs a second to import and was the slowest here. boto3 is synchronous (nothing to
inherit half-way across fork), reads the whole standard AWS chain (keys, session token, region,
``AWS_ENDPOINT_URL``, profiles, SSO, web identity, instance metadata) and refreshes expiring
credentials itself, and speaks S3's conditional put (``If-None-Match: *``) for the push lock.

Clients are never inherited across ``fork``: an `ObjectStore` pickles as its URL and options, and
builds its session and client on first use in each process (keyed by pid). Retries are ours, not
botocore's (which is set to one attempt), so that one `RetryPolicy` bounds them: timeouts,
connection resets, a body cut mid-transfer, throttling and 5xx are retried with exponential
backoff and full jitter until ``total_s`` (and ``attempts``, when set); a missing object is `RemoteNotFound`
at once, a refused or unauthenticated request `RemoteError` at once, each naming the URL and fix.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from loaders.remote.policy import RETRY_ENV, RemoteError, RemoteNotFound, RetryPolicy
from loaders.remote.s3 import (
    CLIENT_OPTIONS,
    SESSION_OPTIONS,
    boto3_module,
    error_code,
    make_client,
    transient,
    translate,
)

T = TypeVar("T")
# S3 and S3-compatible servers (MinIO, Ceph, R2, GCS's XML API) through AWS_ENDPOINT_URL; "file://"
# is not a URL here: it names a local folder (`local_path`)
SCHEMES = ("s3", "s3a")
CHUNK = 8 << 20  # bytes per write when streaming an object to a file


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a dataset in object storage (``scheme://...`` with a scheme the store
    serves). A local path is not, and neither is ``file://``: that is a local folder."""
    if not isinstance(path, str):
        return False  # a Path (even of "s3:/x", which Path made of "s3://x") is local
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


def local_path(path: str | os.PathLike[str]) -> Path:
    """A local dataset folder, also when given as ``file:///abs/path``."""
    text = os.fspath(path)
    return Path(text[len("file://") :] if text.startswith("file://") else text)


__all__ = [  # RetryPolicy and the errors live in loaders.remote.policy, re-exported: one API
    "RETRY_ENV",
    "SCHEMES",
    "ObjectInfo",
    "ObjectStore",
    "RemoteError",
    "RemoteNotFound",
    "RetryPolicy",
    "is_url",
    "local_path",
    "open_store",
]


@dataclass(frozen=True)
class ObjectInfo:
    """One object: its key relative to the dataset prefix, its size in bytes, its ETag."""

    key: str
    size: int
    etag: str | None = None


def _split(url: str) -> tuple[str, str]:
    """``scheme://bucket/a/b/`` -> (``scheme://bucket``, ``a/b``)."""
    scheme, _, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    return f"{scheme.lower()}://{bucket}", prefix.strip("/")


@dataclass
class ObjectStore:
    """The objects under one dataset prefix URL, by key (``index.json``, ``shards/<file>``, ...).
    Build with `open_store`. Safe to pickle and to use after fork: the client is made per pid.
    ``stats`` counts requests and bytes by operation (``get_requests``, ``put_bytes``, ...) and
    ``retries``, for tests and progress reports."""

    url: str
    options: dict[str, Any] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    stats: Counter[str] = field(default_factory=Counter, compare=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        root, self.prefix = _split(self.url)
        self.bucket = root.partition("://")[2]
        self._client: tuple[int, Any] | None = None
        self._locked: tuple[int, threading.Lock] = (os.getpid(), threading.Lock())

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.options, "retry": self.retry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["options"], state["retry"])  # type: ignore[misc]

    def key_url(self, key: str) -> str:
        return f"{self.url}/{key}" if key else self.url

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @property
    def client(self) -> Any:
        """This process's boto3 client (made on first use here: never one inherited by fork)."""
        pid = os.getpid()
        if self._client is None or self._client[0] != pid:
            with self._lock():
                if self._client is None or self._client[0] != pid:
                    self._client = (pid, make_client(self.url, self.options, self.retry))
        return self._client[1]

    def _lock(self) -> threading.Lock:
        """This process's lock: one inherited by fork may have been held by a parent's thread."""
        pid = os.getpid()
        if self._locked[0] != pid:
            self._locked = (pid, threading.Lock())
        return self._locked[1]

    def _count(self, op: str, nbytes: int = 0) -> None:
        with self._lock():  # uploads and prefetches count from several threads
            self.stats[f"{op}_requests"] += 1
            self.stats[f"{op}_bytes"] += nbytes

    # -- reads ----------------------------------------------------------------------------------
    def get(self, key: str) -> bytes:
        def once() -> bytes:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()

        data = self._retrying(key, "GET", once)
        self._count("get", len(data))
        return data

    def get_to_file(self, key: str, path: str | os.PathLike[str]) -> int:
        """Stream the object into ``path`` (created or truncated); its size. The caller renames."""

        def once() -> int:
            n = 0
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            with _LocalFile(path) as f:
                for chunk in body.iter_chunks(CHUNK):
                    f.write(chunk)
                    n += len(chunk)
            return n

        n = self._retrying(key, "GET", once)
        self._count("get", n)
        return n

    def head(self, key: str) -> ObjectInfo | None:
        """The object's size and ETag; None when it does not exist."""
        self._count("head")
        try:
            meta = self._retrying(
                key, "HEAD", lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            )
        except RemoteNotFound:
            return None
        return ObjectInfo(key, int(meta["ContentLength"]), meta.get("ETag"))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object under ``prefix`` (a key prefix, e.g. ``"shards/"``), keys relative to the
        dataset, in key order. A bucket that does not exist is `RemoteNotFound`."""
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        token: str | None = None
        while True:
            args = {
                "Bucket": self.bucket,
                "Prefix": full,
                **({"ContinuationToken": token} if token else {}),
            }
            page = self._retrying(prefix, "LIST", lambda a=args: self.client.list_objects_v2(**a))
            self._count("list")
            for obj in page.get("Contents", []):
                yield ObjectInfo(obj["Key"][strip:], int(obj["Size"]), obj.get("ETag"))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    # -- writes ---------------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        self._retrying(
            key,
            "PUT",
            lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data),
        )
        self._count("put", len(data))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> int:
        """Upload a local file in one PUT (S3's limit: 5 GiB; shards are far smaller); its size."""

        def once() -> None:
            with open(path, "rb") as f:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=f)

        size = os.path.getsize(path)
        self._retrying(key, "PUT", once)
        self._count("put", size)
        return size

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` unless it exists (S3 ``If-None-Match: *``); False if it existed. A server
        that ignores the header overwrites: docs/REMOTE.md "Push lock" says what push does then."""

        def once() -> bool:
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
                )
            except Exception as e:
                if error_code(e) in (
                    "PreconditionFailed",
                    "ConditionalRequestConflict",
                    "412",
                    "409",
                ):
                    return False
                raise
            return True

        created = self._retrying(key, "PUT", once)
        self._count("put", len(data))
        return created

    def delete(self, key: str) -> None:
        """Delete ``key``; one already gone is fine (S3 answers 204 either way)."""
        self._retrying(
            key, "DELETE", lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        )
        self._count("delete")

    def _retrying(self, key: str, op: str, call: Callable[[], T]) -> T:
        """``call()``, retried for transient failures with exponential backoff and full jitter,
        within the policy's attempts and total time; every other failure at once, translated."""
        deadline = time.monotonic() + self.retry.total_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except LocalWriteError as e:  # this node's disk, not the request: the caller's to say
                raise e.error from None
            except Exception as e:
                err = translate(e, self.key_url(key), op)
                pause = random.uniform(
                    0, min(self.retry.max_s, self.retry.base_s * 2 ** (attempt - 1))
                )
                if not (
                    transient(e)
                    and self.retry.more(attempt)
                    and time.monotonic() + pause < deadline
                ):
                    if transient(e):
                        err = RemoteError(
                            err.url,
                            f"{err.problem} (gave up after {attempt} attempt(s))",
                            err.fix,
                        )
                    raise err from None
                with self._lock():
                    self.stats["retries"] += 1
                time.sleep(pause)


class LocalWriteError(Exception):
    """Writing a downloaded object to the local file failed (``error``: a full disk, a folder
    removed): never retried nor reported as a failed request, but raised as that ``OSError``
    for the caller (the node cache: its documented ``CacheError``)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _LocalFile:
    """The local file a GET streams into, whose every ``OSError`` (open, write, the flush at
    close) is a :class:`LocalWriteError`; the stream's own errors pass through (retried)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            self._f = open(path, "wb")  # noqa: SIM115 - closed in __exit__
        except OSError as e:
            raise LocalWriteError(e) from e

    def __enter__(self) -> _LocalFile:
        return self

    def write(self, chunk: bytes) -> None:
        try:
            self._f.write(chunk)
        except OSError as e:
            raise LocalWriteError(e) from e

    def __exit__(self, *exc: object) -> None:
        try:
            self._f.close()
        except OSError as e:
            if exc[0] is None:
                raise LocalWriteError(e) from e


def open_store(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> ObjectStore:
    """The store of the dataset at ``url``, for the calling process. ``storage_options`` (over the
    AWS environment): ``endpoint_url``, ``region_name``, ``profile_name``,
    ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``, ``verify``, plus
    ``retry_<field>`` for `RetryPolicy` fields (``retry_attempts=2``). ``retry`` (else
    ``SHARDSMITH_REMOTE_RETRY``, else the defaults) bounds every request."""
    if not is_url(url):
        raise RemoteError(
            url, "not an object-storage URL", f"use {' or '.join(s + '://' for s in SCHEMES)}"
        )
    options = dict(storage_options or {})
    policy = retry or RetryPolicy.from_env()
    overrides = {
        k[len("retry_") :]: options.pop(k) for k in list(options) if k.startswith("retry_")
    }
    if overrides:
        policy = RetryPolicy.parse(",".join(f"{k}={v}" for k, v in overrides.items()), policy)
    unknown = sorted(set(options) - set(SESSION_OPTIONS) - set(CLIENT_OPTIONS))
    if unknown:
        raise RemoteError(
            url,
            f"unknown storage_options {unknown}",
            f"use {', '.join(SESSION_OPTIONS + CLIENT_OPTIONS)} or retry_<RetryPolicy field>",
        )
    boto3_module()  # the install hint now, not at the first request
    return ObjectStore(url, options, policy)
