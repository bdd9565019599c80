"""The node cache's limit, eviction and failure handling (loaders/remote/cache.py): a limit that
cannot hold the windows in flight is refused at open, eviction keeps the cache under the limit
while the batches stay those of the local folder, a full disk leaves nothing partial."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardDataset, ShardLoader
from loaders.remote import cache as cache_mod
from loaders.remote.ahead import in_flight_bytes
from loaders.remote.cache import CacheError, NodeCache
from loaders.remote.ledger import cache_bytes
from tests import hostile

pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::RuntimeWarning")]
KW: dict[str, Any] = {"split": "train", "batch_size": 32, "window": 1, "seed": 5}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]) -> Any:
    return build_dataset(tmp_path_factory.mktemp("evict"), formats=("tar",), n_shards=8)


@pytest.mark.process
@pytest.mark.s3
@hostile.parametrize
def test_eviction_keeps_the_limit_and_the_batches(
    case: hostile.Case,
    built: Any,
    s3_proxy: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    assert_same: Callable[..., None],
) -> None:
    url = upload(built.outs["tar"], f"{s3_bucket}/ds")
    local_ds = ShardDataset(built.outs["tar"], **KW)
    sizes = [e.bytes for e in local_ds.entries]
    assert len(sizes) >= 6
    limit = in_flight_bytes(sizes, KW["window"])
    with pytest.raises(ValueError, match="smaller than the windows in flight"):
        ShardDataset(url, cache_dir=tmp_path / "c", cache_limit=limit - 1, **KW)
    ds = ShardDataset(url, cache_dir=tmp_path / "c", cache_limit=limit, **KW)
    got, peak = [], 0
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        local_ds.set_epoch(epoch)
        for b in ShardLoader(ds):
            got.append(b)
            peak = max(peak, cache_bytes(tmp_path / "c"))
    want = []
    for epoch in (0, 1):
        local_ds.set_epoch(epoch)
        want += list(ShardLoader(local_ds))
    assert_same(got, want)
    assert 0 < peak <= limit
    # more shard GETs than shards: evicted shards came back in the second epoch
    assert sum(s3_proxy.gets().values()) > len(sizes)
    # a local folder is read in place: no cache ledger in it, nothing of it evicted
    assert not list(built.outs["tar"].rglob(".pins")) and all(
        (built.outs["tar"] / "shards" / e.file).exists() for e in local_ds.entries
    )


@pytest.mark.process
@pytest.mark.s3
@hostile.parametrize
def test_a_limit_too_small_for_the_loaders_workers_is_refused(
    case: hostile.Case, built: Any, s3_bucket: str, upload: Callable[..., str], tmp_path: Path
) -> None:
    """Each DataLoader worker pins windows of its own: a limit that holds one reading process's
    windows but not two workers' is refused when the loader is made, naming num_workers (it
    used to wait on the pins for a minute, then fail)."""
    url = upload(built.outs["tar"], f"{s3_bucket}/workers")
    sizes = [e.bytes for e in ShardDataset(built.outs["tar"], **KW).entries]
    one = in_flight_bytes(sizes, KW["window"])
    assert in_flight_bytes(sizes, KW["window"], workers=2) == 2 * one
    ds = ShardDataset(url, cache_dir=tmp_path / "c", cache_limit=one, **KW)
    with pytest.raises(ValueError, match=r"smaller than the windows in flight.*num_workers=2"):
        ShardLoader(ds, num_workers=2)
    ShardLoader(ds, num_workers=1)  # one worker reads as the rank itself would
    roomy = ShardDataset(url, cache_dir=tmp_path / "c", cache_limit=2 * one, **KW)
    ShardLoader(roomy, num_workers=2)


class FullDisk:
    """A store whose downloads write half of an object, then fail as a full disk does."""

    url = "s3://fake/ds"

    def key_url(self, key: str) -> str:
        return f"{self.url}/{key}"

    def get_to_file(self, key: str, path: Any) -> int:
        Path(path).write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")


@hostile.parametrize
def test_full_disk_is_a_clear_error_and_keeps_no_partial_file(
    case: hostile.Case, tmp_path: Path
) -> None:
    from loaders.format.values import ShardEntry

    entry = ShardEntry("s-0.tar", "train", 1, {"cells": 1}, 100, 100, "", "k")
    cache = NodeCache("s3://fake/ds", tmp_path / "c" / "u" / "d", tmp_path / "c", "tar")
    cache._store = FullDisk()  # type: ignore[assignment]
    with pytest.raises(CacheError, match="is full.*nothing partial was kept"):
        with cache.ready([entry]):
            pass
    left = [
        p for p in (tmp_path / "c").rglob("*") if p.is_file() and p.suffix not in (".pin", ".dl")
    ]
    assert left == [] and cache_bytes(tmp_path / "c") == 0
    assert cache_mod.THREADS >= 1


@pytest.mark.process
@pytest.mark.s3
@hostile.parametrize
def test_another_generation_at_the_same_url_is_never_served_from_the_old_cache(
    case: hostile.Case,
    build_dataset: Callable[..., Any],
    s3_proxy: Any,
    s3_bucket: str,
    s3_client: Any,
    upload: Callable[..., str],
    tmp_path: Path,
    batches: Callable[..., Any],
    assert_same: Callable[..., None],
) -> None:
    # two datasets whose shards have the same names and other contents
    a = build_dataset(tmp_path / "a", "shards", n_shards=4, cells=30, genes=12, seed=1).root
    b = build_dataset(tmp_path / "b", "shards", n_shards=4, cells=30, genes=12, seed=2).root
    url = upload(a, f"{s3_bucket}/ds")
    kw = {"split": "train", "batch_size": 16, "window": 2}
    assert_same(
        batches(ShardDataset(url, cache_dir=tmp_path / "c", **kw)), batches(ShardDataset(a, **kw))
    )
    bucket = s3_bucket.removeprefix("s3://")  # b over a, as a rebuild in place would leave it
    for p in sorted(p for p in b.rglob("*") if p.is_file()):
        s3_client.put_object(
            Bucket=bucket, Key=f"ds/{p.relative_to(b).as_posix()}", Body=p.read_bytes()
        )
    got = batches(ShardDataset(url, cache_dir=tmp_path / "c", **kw))
    assert_same(got, batches(ShardDataset(b, **kw)))
    assert len(list((tmp_path / "c").glob("*/*/index.json"))) == 2  # one folder per generation


class Bytes:
    """A store whose every object is 100 bytes."""

    url = "s3://fake/ds"

    def key_url(self, key: str) -> str:
        return f"{self.url}/{key}"

    def get_to_file(self, key: str, path: Any) -> int:
        Path(path).write_bytes(b"x" * 100)
        return 100


@hostile.parametrize
def test_pinned_shards_are_never_evicted_and_a_full_limit_fails_not_hangs(
    case: hostile.Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loaders.format.values import ShardEntry

    monkeypatch.setattr(cache_mod, "WAIT_S", 0.5)
    e1, e2 = (ShardEntry(f"s-{i}.tar", "train", 1, {"cells": 1}, 100, 100, "", "k") for i in (1, 2))
    one = NodeCache("s3://fake/a", tmp_path / "c" / "a" / "1", tmp_path / "c", "tar", limit=150)
    two = NodeCache("s3://fake/b", tmp_path / "c" / "b" / "1", tmp_path / "c", "tar", limit=150)
    one._store = two._store = Bytes()  # type: ignore[assignment]
    with one.ready([e1]):  # another process's window in flight
        with pytest.raises(CacheError, match="does not fit under cache_limit=150.*pinned"):
            with two.ready([e2]):
                pass
        assert one.cached(e1) and not two.cached(e2)
    with two.ready([e2]):  # unpinned now: the least recently used goes
        assert two.cached(e2) and not one.cached(e1)
    assert cache_bytes(tmp_path / "c") == 100


@pytest.mark.process
@pytest.mark.s3
def test_a_downloaded_size_is_recorded_under_the_folder_lock(
    built: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every ledger entry written with a size under a limit is written while this process holds
    the cache folder's lock: rewriting an entry truncates it first, so an evictor on another
    thread that read it unlocked took it for empty and let one shard too many in."""
    import fcntl
    import os

    url = upload(built.outs["tar"], f"{s3_bucket}/locked")
    lock = tmp_path / "c" / cache_mod.LOCK
    unlocked: list[int] = []
    real = cache_mod.write_size

    def checked(pin: Path, size: int) -> None:
        if size:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody holds it
                unlocked.append(size)
            except BlockingIOError:
                pass  # held (by this process: nothing else uses this folder)
            finally:
                os.close(fd)
        real(pin, size)

    monkeypatch.setattr(cache_mod, "write_size", checked)
    sizes = [e.bytes for e in ShardDataset(built.outs["tar"], **KW).entries]
    ds = ShardDataset(url, cache_dir=tmp_path / "c", cache_limit=2 * sum(sizes), **KW)
    assert sum(1 for _ in ShardLoader(ds)) > 0
    assert cache_bytes(tmp_path / "c") > 0 and unlocked == []


class Gated(Bytes):
    """Bytes, but the download of ``slow`` waits for ``go``: a shard in flight, held there."""

    def __init__(self, slow: str) -> None:
        import threading

        self.slow, self.started, self.go = slow, threading.Event(), threading.Event()

    def get_to_file(self, key: str, path: Any) -> int:
        if key.endswith(self.slow):
            self.started.set()
            assert self.go.wait(10)
        return super().get_to_file(key, path)


def test_a_shard_in_flight_is_never_evicted_so_the_limit_holds(tmp_path: Path) -> None:
    """A dropped reader's read-ahead finishes the download running (``release``) but pins it no
    more. Another reader's reservation once evicted it in flight (its ledger entry zeroed, no
    file yet to remove), and the download then landed and wrote its size back: three shards of
    100 bytes under a limit of 200. A shard whose download lock is held is counted, never
    evicted: the reservation waits for it to land, then evicts it."""
    import threading

    from loaders.format.values import ShardEntry

    e1, e2, e3 = (
        ShardEntry(f"s-{i}.tar", "train", 1, {"cells": 1}, 100, 100, "", "k") for i in (1, 2, 3)
    )
    cache = NodeCache("s3://fake/ds", tmp_path / "c" / "a" / "1", tmp_path / "c", "tar", limit=200)
    cache._store = store = Gated(e1.file)  # type: ignore[assignment]
    cache.prefetch([[e1]], owner=1)
    assert store.started.wait(10)
    cache.release(1)  # the reader was dropped: e1 downloads on, unpinned
    threading.Timer(0.5, store.go.set).start()
    with cache.ready([e2, e3]):
        assert cache.cached(e2) and cache.cached(e3)
    assert cache._jobs[e1.file].exception(10) is None
    on_disk = sum(cache.cached(e) for e in (e1, e2, e3)) * 100
    assert cache_bytes(tmp_path / "c") <= 200 and on_disk <= 200
