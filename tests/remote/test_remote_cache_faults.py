"""The node cache when this node's disk fails it (issue 45, items 10-11): a cached shard damaged
after its checked download is downloaded again once (then a ``CacheError`` naming the cache folder
and the fix), the cache folder removed under a running epoch is made again, and a real full disk
(a 2 MiB tmpfs, mounted by the test as root) is the documented ``CacheError``."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardDataset, ShardLoader
from loaders.format.files import shard_digest_matches
from loaders.remote.cache import CacheError, NodeCache
from pipeline.cli import main
from tests import hostile

pytestmark = [pytest.mark.s3, pytest.mark.filterwarnings("ignore::RuntimeWarning")]
KW: dict[str, Any] = {"split": "train", "batch_size": 32, "window": 1, "seed": 5}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]) -> Path:
    return build_dataset(tmp_path_factory.mktemp("faults"), formats=("tar",), n_shards=6).out


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _cached_shards(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("*/*/shards/*") if p.is_file())


@pytest.mark.process  # the first readers decode in the decoder process
@hostile.parametrize
def test_a_damaged_cached_copy_is_downloaded_again_once(
    case: hostile.Case,
    built: Path,
    s3_proxy: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    batches: Callable[..., Any],
    assert_same: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = upload(built, f"{s3_bucket}/ds")
    cache = tmp_path / "cache"
    want = batches(ShardDataset(built, **KW))
    assert_same(batches(ShardDataset(url, cache_dir=cache, **KW)), want)
    damaged = _cached_shards(cache)[0]
    _flip(damaged)
    s3_proxy.requests.clear()
    # a later process (a new reader): the damaged copy is downloaded again, the batches are right
    assert_same(batches(ShardDataset(url, cache_dir=cache, decode_process=False, **KW)), want)
    assert sum(s3_proxy.gets().values()) == 1, s3_proxy.gets()
    # `verify URL` on the warm cache: the damaged copy is fetched again, not reported as remote
    _flip(damaged)
    monkeypatch.setenv("SHARDSMITH_CACHE", str(cache))
    assert main(["verify", url, "-q"]) == 0
    # a disk that damages what it keeps: the second failure names the cache folder and the fix
    refetch = NodeCache.refetch

    def refetch_then_damage(self: NodeCache, entry: Any) -> None:
        refetch(self, entry)
        _flip(self.path(entry))

    monkeypatch.setattr(NodeCache, "refetch", refetch_then_damage)
    _flip(damaged)
    with pytest.raises(CacheError, match="downloaded again, and fails again") as e:
        batches(ShardDataset(url, cache_dir=cache, decode_process=False, **KW))
    assert str(cache) in str(e.value) and "cache_dir=" in str(e.value)


@hostile.parametrize
def test_the_cache_folder_removed_mid_epoch_is_made_again(
    case: hostile.Case,
    built: Path,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    assert_same: Callable[..., None],
) -> None:
    url = upload(built, f"{s3_bucket}/ds")
    cache = tmp_path / "cache"
    want = [dict(b) for b in ShardLoader(ShardDataset(built, **KW), pin_memory=False)]
    ds = ShardDataset(url, cache_dir=cache, decode_process=False, **KW)
    got = []
    for n, batch in enumerate(ShardLoader(ds, pin_memory=False)):  # one epoch
        got.append(dict(batch))
        if n == 1:  # `rm -rf ~/.cache/shardsmith` while a run reads (moved first: downloads
            # in flight write into it meanwhile)
            cache.rename(tmp_path / "removed")
            shutil.rmtree(tmp_path / "removed", ignore_errors=True)
    assert_same(got, want)
    assert (cache / ds.root.parent.name / ds.root.name / "index.json").is_file()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted at ``tmp_path/small`` (root only), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a 2 MiB tmpfs (a real full disk)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """Take the disk's free space but ``leave`` bytes, as another job's files would."""
    with open(disk / "filler", "wb", buffering=0) as f:
        free = shutil.disk_usage(disk).free - leave
        for size in (65536, 4096):
            while free >= size:
                try:
                    f.write(b"\0" * size)
                except OSError:
                    break
                free -= size


@pytest.mark.root
@hostile.parametrize
def test_a_real_full_disk_is_the_documented_cache_error(
    case: hostile.Case,
    built: Path,
    s3_bucket: str,
    upload: Callable[..., str],
    small_disk: Path,
    batches: Callable[..., Any],
) -> None:
    """``case.data``: the bytes left free, as a fraction of the smallest shard (0: the ledger's
    first write fails; 0.5: the download itself)."""
    url = upload(built, f"{s3_bucket}/ds")
    cache = small_disk / "cache"
    ds = ShardDataset(url, cache_dir=cache, decode_process=False, **KW)  # index.json fits
    _fill(small_disk, int(case.data * min(e.bytes for e in ds.entries)))
    with pytest.raises(CacheError, match=r"is full while downloading .*nothing partial") as e:
        batches(ds)
    assert str(cache) in str(e.value) and "cache_limit=" in str(e.value)
    deadline = time.monotonic() + 30  # a prefetch in flight on another thread fails on its own
    while partial := list(ds.root.glob(".tmp/*")):
        assert time.monotonic() < deadline, f"a partial download was kept: {partial}"
        time.sleep(0.1)
    kept = {p.name for p in ds.root.glob("shards/*")}  # whole and checked, or none
    assert all(
        shard_digest_matches(e, ds.root / "shards" / e.file) for e in ds.entries if e.file in kept
    )
