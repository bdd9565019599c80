"""Which ``index.json`` a process opening a URL reads: fetched from the server (the commit point),
shared by the ranks of one job on a node, or, when the server cannot be read (or with
``offline=True``), the copy this node fetched last, if every shard the reader needs is cached.

Why share: every rank opening a dataset fetched ``index.json`` again (Mosaic does the same on every
rank, mosaicml/streaming#662; Hugging Face cut start-up requests 100x by resolving the file list
once per node). Ranks of one job on one node read the index one of them fetched, so the node asks
once and its ranks agree on the generation. A job is named by what the launcher sets
(``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``/``SLURM_STEP_ID``, else ``MASTER_ADDR``:``MASTER_PORT``)
when ``WORLD_SIZE`` > 1, and a shared copy is used for ``SHARE_S`` seconds after its fetch: a
later run with the same name (a reused port) fetches again. A single process always fetches.

Why offline: with every shard of a split in the node cache, the server is not needed to train; a
job that could not start while S3 was down had everything it needed on disk. The fallback says
the copy's age in a warning, and a reader that lacks shards still gets the server's error.

``<cache_dir>/<url hash>/latest.json`` records the last fetch: ``{"digest", "fetched_at",
"job"}``; the index itself is ``<cache_dir>/<url hash>/<digest[:32]>/index.json``.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from loaders.format.files import atomic_write_bytes
from loaders.remote.ledger import locked
from loaders.remote.store import ObjectStore, RemoteError, RemoteNotFound

LATEST, LOCK = "latest.json", ".index.lock"
HEX = re.compile(r"[0-9a-f]{32,64}")
SHARE_S = 300.0  # how long ranks of one job reuse the index one of them fetched
JOB_ENV = (
    ("TORCHELASTIC_RUN_ID",),
    ("SLURM_JOB_ID", "SLURM_STEP_ID"),
    ("MASTER_ADDR", "MASTER_PORT"),
)


@dataclass(frozen=True)
class Fetched:
    """The index a reader opens: its bytes, and why it did not come from the server now
    (``""``: fetched now; ``"shared"``: another rank of the job fetched it; ``"offline"``: the
    node's last copy, opened without the server)."""

    data: bytes
    how: str = ""
    age_s: float = 0.0
    cause: RemoteError | None = None  # the server's error behind an "offline" fallback


def job_key() -> str | None:
    """The name of the distributed job this process belongs to, from its launcher's
    environment; None for a single process (or a launcher that names nothing)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    for names in JOB_ENV:
        values = [os.environ.get(n, "") for n in names]
        if all(values) and values != ["none"]:  # torchrun's run id when none was given
            return ":".join([names[0], *values])
    return None


def _latest(url_dir: Path) -> tuple[str, float, str | None] | None:
    """``(digest, fetched_at, job)`` of the last index this node fetched for the URL (an older
    cache without ``latest.json``: its newest index file, by modification time)."""
    try:
        rec = json.loads((url_dir / LATEST).read_text())
        if HEX.fullmatch(str(rec["digest"])):  # it becomes a path: hex digits only
            return str(rec["digest"]), float(rec["fetched_at"]), rec.get("job")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = sorted(
        (p.stat().st_mtime, p.parent.name) for p in url_dir.glob("*/index.json") if p.is_file()
    )
    return (found[-1][1], found[-1][0], None) if found else None


def _copy(url_dir: Path, digest: str) -> bytes | None:
    try:
        return (url_dir / digest[:32] / "index.json").read_bytes()
    except OSError:
        return None


def record(url_dir: Path, digest: str, job: str | None) -> None:
    """The index just fetched (and stored under ``url_dir/<digest[:32]>/``) is the node's latest."""
    body = {"digest": digest, "fetched_at": time.time(), "job": job}
    atomic_write_bytes(url_dir / LATEST, (json.dumps(body) + "\n").encode())


def fetch_index(
    store: ObjectStore, url_dir: Path, offline: bool, store_copy: Callable[[bytes], str]
) -> Fetched:
    """The index to open. ``store_copy(data)`` writes a fetched index into its cache folder and
    returns its digest. The caller checks an ``"offline"`` one against the shards it needs
    (:func:`check_offline`)."""
    if offline:
        last = _latest(url_dir)
        data = _copy(url_dir, last[0]) if last else None
        if last is None or data is None:
            raise RemoteError(
                store.key_url("index.json"),
                f"offline=True, but this node has no copy of its index in {url_dir.parent}",
                "open it once with the server reachable (and read its shards), or drop offline=",
            )
        return Fetched(data, "offline", time.time() - last[1])
    job = job_key()
    url_dir.mkdir(parents=True, exist_ok=True)
    with locked(url_dir / LOCK) if job else nullcontext():
        last = _latest(url_dir)
        if job and last and last[2] == job and 0 <= time.time() - last[1] < SHARE_S:
            data = _copy(url_dir, last[0])
            if data is not None:
                return Fetched(data, "shared", time.time() - last[1])
        try:
            data = store.get("index.json")
        except RemoteNotFound:  # an answer: no dataset there (now), not an outage
            raise
        except RemoteError as e:  # no answer, or a refused one: the node's copy, if it has one
            copy = _copy(url_dir, last[0]) if last else None
            if last is None or copy is None:
                raise
            return Fetched(copy, "offline", time.time() - last[1], e)
        record(url_dir, store_copy(data), job)
        return Fetched(data)


def age_text(seconds: float) -> str:
    """``3 h 12 min``, ``4 min``, ``12 s``: how old a copy is, for people."""
    s = int(max(0.0, seconds))
    if s >= 86400:
        return f"{s // 86400} d {s % 86400 // 3600} h"
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 60} min" if s >= 60 else f"{s} s"


def check_offline(
    fetched: Fetched, url: str, explicit: bool, missing: list[str], split: str | None
) -> None:
    """An index opened without the server: fine when the node cache holds every shard the
    reader needs (``missing`` is empty), with a warning naming its age unless the caller asked
    for ``offline=True``; otherwise the server's error (or, offline on purpose, what is missing)."""
    if fetched.how != "offline":
        return
    what = f"split {split!r}" if split else "the dataset"
    if missing:
        names = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
        cause = fetched.cause
        detail = (
            f"the node cache lacks {len(missing)} shard(s) of {what} ({names}), so it cannot be "
            f"read offline (its index here is {age_text(fetched.age_s)} old)"
        )
        if cause is not None and not explicit:
            raise RemoteError(cause.url, f"{cause.problem}; {detail}", cause.fix) from None
        raise RemoteError(url, f"offline=True: {detail}", "open it with the server reachable")
    if not explicit:
        warnings.warn(
            f"{url}: the server cannot be read ({fetched.cause}); opening the index.json this node "
            f"fetched {age_text(fetched.age_s)} ago: every shard of {what} is in the node cache. "
            "A push since then is not seen until the server answers again.",
            RuntimeWarning,
            stacklevel=4,
        )
