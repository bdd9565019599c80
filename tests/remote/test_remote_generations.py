"""A new generation pushed to a URL the node already reads: its unchanged shards are taken from
the previous generation's cache folder (loaders/remote/reuse.py), checked against the new index,
instead of downloaded again; a changed or damaged one is downloaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardDataset
from loaders.format.integrity import DatasetRebuilt
from loaders.remote import open_store
from loaders.remote.store import RemoteNotFound
from tests import hostile

pytestmark = [
    pytest.mark.process,
    pytest.mark.s3,
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]  # an S3 server (SeaweedFS); the decoder process
KW: dict[str, Any] = {"split": "train", "batch_size": 32, "window": 2, "seed": 1}


def _read_whole(url: str, cache: Path) -> list[Any]:
    """Every batch of one epoch (so every train shard is in the cache after it)."""
    return list(ShardDataset(url, cache_dir=cache, **KW))


@hostile.parametrize
def test_unchanged_shards_come_from_the_previous_generation(
    case: hostile.Case,
    rebuildable: Any,
    s3_proxy: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    assert_same: Callable[..., None],
) -> None:
    out, change_source_1 = rebuildable
    url = upload(out, f"{s3_bucket}/ds")
    cache = tmp_path / "cache"
    _read_whole(url, cache)
    written = change_source_1()
    train = {e.file for e in ShardDataset(out, **KW).entries}
    changed = {f for f in train if any(f.startswith(w) for w in written)}
    assert changed and train - changed, "the rebuild changes some train shards, not all"
    if case.data == "damaged":  # the previous generation's copy of an unchanged shard altered
        victim = sorted(train - changed)[0]
        old = next(p for p in cache.glob(f"*/*/shards/{victim}"))
        part = next(p for p in sorted(old.rglob("*")) if p.is_file() and p.stat().st_size > 64)
        part.write_bytes(part.read_bytes()[:-8] + b"damaged!")
        changed.add(victim)
    upload(out, url)
    s3_proxy.reset()
    got = _read_whole(url, cache)
    assert_same(got, list(ShardDataset(out, **KW)))
    fetched = {name for name in train if any(f"/shards/{name}" in p for p in s3_proxy.gets())}
    assert fetched == changed
    assert len(list(cache.glob("*/*/index.json"))) == 2  # one folder per generation


@hostile.parametrize
def test_a_reader_of_a_deleted_generation_is_told_to_reopen(
    case: hostile.Case,
    rebuildable: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, change_source_1 = rebuildable
    url = upload(out, f"{s3_bucket}/ds")
    # nothing downloaded yet: without the read-ahead at open, which fetches the first windows
    monkeypatch.setenv("SHARDSMITH_PREFETCH_AT_OPEN", "0")
    opened = ShardDataset(url, cache_dir=tmp_path / "cache", **KW)
    for _ in range(2):  # two pushes later, the opened generation's objects are deleted
        assert change_source_1()
        upload(out, url)
    with pytest.raises(DatasetRebuilt, match="pushed again since this reader opened it"):
        list(opened)


@hostile.parametrize
def test_an_object_deleted_by_hand_is_not_found_naming_it(
    case: hostile.Case,
    rebuildable: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, _ = rebuildable
    url = upload(out, f"{s3_bucket}/ds")
    monkeypatch.setenv("SHARDSMITH_PREFETCH_AT_OPEN", "0")  # nothing downloaded at open
    opened = ShardDataset(url, cache_dir=tmp_path / "cache", **KW)
    store = open_store(url)
    shard = opened.entries[0].file  # every object of it (a zarr shard is a folder of them)
    for o in list(store.list(f"shards/{shard}/")):
        store.delete(o.key)
    with pytest.raises(RemoteNotFound, match=f"shards/{shard}.*has no objects"):
        list(opened)
