"""Opening a dataset URL: without the server when the node cache holds what the reader needs
(offline), ``index.json`` fetched once per node for the ranks of one job, and a URL given to the
Lightning data module (docs/REMOTE.md, "Opening a URL")."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardDataset
from loaders.remote import RemoteError
from loaders.remote import node_index as node_index_mod
from tests import hostile

pytestmark = pytest.mark.s3
KW: dict[str, Any] = {"split": "train", "batch_size": 64, "window": 2, "seed": 3}
DOWN = "http://127.0.0.1:9"  # nothing listens on port 9
JOB = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]) -> Any:
    return build_dataset(tmp_path_factory.mktemp("open"), formats=("zarr",), n_shards=6)


@pytest.fixture
def cached(
    built: Any, s3_bucket: str, upload: Callable[..., str], tmp_path: Path, batches: Any
) -> tuple[str, Path, list[Any]]:
    """A URL whose train split was read once (every train shard in the node cache), and the
    batches read from the local folder."""
    url = upload(built.outs["zarr"], f"{s3_bucket}/ds")
    batches(ShardDataset(url, cache_dir=tmp_path / "cache", **KW), epochs=(0,))
    return url, tmp_path / "cache", batches(ShardDataset(built.outs["zarr"], **KW))


def _server_down(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", DOWN)
    monkeypatch.setenv("SHARDSMITH_REMOTE_RETRY", "attempts=1,connect_timeout_s=1,total_s=2")


def _age(cache: Path, seconds: float) -> None:
    """Make the node's copy of the index ``seconds`` old."""
    (latest,) = cache.glob(f"*/{node_index_mod.LATEST}")
    rec = json.loads(latest.read_text())
    rec["fetched_at"] = time.time() - seconds
    latest.write_text(json.dumps(rec))


@hostile.parametrize
def test_an_unreachable_server_opens_the_cached_index_with_its_age(
    case: hostile.Case,
    cached: tuple[str, Path, list[Any]],
    monkeypatch: pytest.MonkeyPatch,
    batches: Any,
    assert_same: Callable[..., None],
) -> None:
    url, cache, local = cached
    _age(cache, 3 * 3600 + 12 * 60)
    _server_down(monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"cannot be read .* fetched 3 h 12 min ago"):
        ds = ShardDataset(url, cache_dir=cache, **KW)
    assert_same(batches(ds), local)


def test_offline_true_opens_without_asking_the_server(
    cached: tuple[str, Path, list[Any]],
    monkeypatch: pytest.MonkeyPatch,
    s3_proxy: Any,
    batches: Any,
    assert_same: Callable[..., None],
) -> None:
    url, cache, local = cached
    s3_proxy.requests.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # asked for: no warning
        ds = ShardDataset(url, cache_dir=cache, offline=True, **KW)
    assert_same(batches(ds), local)
    assert s3_proxy.requests == []


@hostile.parametrize
def test_offline_needs_every_shard_of_the_split(
    case: hostile.Case,
    cached: tuple[str, Path, list[Any]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    url, cache, _ = cached
    with pytest.raises(RemoteError, match=r"no copy of its index.*open it once with the server"):
        ShardDataset(url, cache_dir=tmp_path / "empty", offline=True, **KW)
    with pytest.raises(RemoteError, match=r"lacks \d+ shard\(s\) of split 'val'"):
        ShardDataset(url, cache_dir=cache, offline=True, **{**KW, "split": "val"})
    _server_down(monkeypatch)  # the server's own error, with what the cache lacks
    with pytest.raises(RemoteError, match=r"endpoint does not answer.*lacks \d+ shard"):
        ShardDataset(url, cache_dir=cache, **{**KW, "split": "val"})


def test_a_missing_index_is_not_an_outage(
    cached: tuple[str, Path, list[Any]], s3_client: Any, s3_bucket: str
) -> None:
    """The server answering "no index.json" is an answer: never replaced by the node's copy."""
    url, cache, _ = cached
    s3_client.delete_object(Bucket=s3_bucket.removeprefix("s3://"), Key="ds/index.json")
    with pytest.raises(RemoteError, match="no index.json"):
        ShardDataset(url, cache_dir=cache, **KW)


def test_ranks_of_one_job_on_a_node_fetch_the_index_once(
    built: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    s3_proxy: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = upload(built.outs["zarr"], f"{s3_bucket}/ds")

    def index_gets(env: dict[str, str]) -> int:
        s3_proxy.requests.clear()
        for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            monkeypatch.delenv(name, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        for rank in (0, 1):
            ShardDataset(url, cache_dir=tmp_path / "c", rank=rank, world_size=2, **KW)
        return s3_proxy.gets("/index.json")[f"/{s3_bucket[5:]}/ds/index.json"]

    assert index_gets(JOB) == 1  # the second rank reads the node's copy
    assert index_gets({**JOB, "MASTER_PORT": "29512"}) == 1  # another job: its own fetch
    assert index_gets({}) == 2  # not a distributed job: every open asks the server
    monkeypatch.setattr(node_index_mod, "SHARE_S", 0.0)
    assert index_gets({**JOB, "TORCHELASTIC_RUN_ID": "r7"}) == 2  # a copy too old to share


def test_data_module_takes_a_url(
    cached: tuple[str, Path, list[Any]], batches: Any, assert_same: Callable[..., None]
) -> None:
    pytest.importorskip("lightning.pytorch", reason="Lightning not installed")
    from loaders.lightning import ShardDataModule

    url, cache, local = cached
    dm = ShardDataModule(url, batch_size=64, seed=3, window=2, cache_dir=cache)
    dm.setup("fit")
    assert dm.root == url and set(dm.loaders) >= {"train"}
    assert dm.loaders["train"].dataset.url == url.rstrip("/")
    assert os.fspath(dm.loaders["train"].dataset.root).startswith(os.fspath(cache))


def test_a_dropped_reader_stops_its_read_ahead(
    built: Any, s3_bucket: str, upload: Callable[..., str], s3_proxy: Any, tmp_path: Path
) -> None:
    """The read-ahead started at open fetches this rank's first windows one after the other; a
    dataset dropped meanwhile lets its running downloads finish and starts no further window
    (it used to fetch them all, taking the link from whatever came next)."""
    import gc

    from loaders.remote.ahead import rank_windows

    url = upload(built.outs["zarr"], f"{s3_bucket}/ds")
    s3_proxy.fault = lambda m, p, n: "stall" if m == "GET" and "/shards/" in p else None
    s3_proxy.stall_s = 0.3
    s3_proxy.requests.clear()
    ds = ShardDataset(url, cache_dir=tmp_path / "c", **{**KW, "window": 1})
    wins, shards = rank_windows(ds, 0), ds.root / "shards"
    assert len(wins) >= 3
    first = {ds.entries[s].file for s in ds.reader.window_shards(0, wins[0]).tolist()}
    del ds
    gc.collect()
    deadline = time.monotonic() + 60  # window 0's stalled downloads end...
    while not all((shards / f).exists() for f in first) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # ...and a chain still running would start window 1 meanwhile
    fetched = {p.split("/shards/")[1].split("/")[0] for p in s3_proxy.gets()}
    assert fetched and fetched <= first, (sorted(fetched), sorted(first))


def test_the_first_windows_download_while_the_condition_table_does(
    built: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    s3_proxy: Any,
    s3_client: Any,
    tmp_path: Path,
) -> None:
    """The open starts its first windows' downloads before it waits for the condition table
    beside index.json (it fetched the table first, request after request: the first window
    queued behind it, 0.1 s of a 100 Mbit link, and behind its own listings' latency); the
    open still returns with the table in, and a table that cannot be fetched is still the
    open's error, naming it."""
    url = upload(built.outs["zarr"], f"{s3_bucket}/ds")
    stalled: list[str] = []

    def fault(method: str, path: str, n: int) -> str | None:
        if method == "GET" and "/conditions-" in path and not stalled:
            stalled.append(path)
            return "stall"
        return None

    s3_proxy.fault, s3_proxy.stall_s = fault, 1.5
    s3_proxy.requests.clear()
    ds = ShardDataset(url, cache_dir=tmp_path / "c", **KW)
    gets = [p for m, p in s3_proxy.requests if m == "GET"]
    first_shard = min(i for i, p in enumerate(gets) if "/shards/" in p)
    last_table = max(i for i, p in enumerate(gets) if "/conditions-" in p)
    assert stalled and first_shard < last_table, gets
    assert ds.reader.sample.vectors() is not None  # the table is in when the open returns
    s3_proxy.reset()
    bucket, table = s3_bucket.removeprefix("s3://"), stalled[0].split("/")[3]
    for o in s3_client.list_objects_v2(Bucket=bucket, Prefix=f"ds/{table}")["Contents"]:
        s3_client.delete_object(Bucket=bucket, Key=o["Key"])
    with pytest.raises(RemoteError, match=table):
        ShardDataset(url, cache_dir=tmp_path / "fresh", **KW)


@pytest.mark.process
def test_the_open_imports_zarr_while_the_first_window_downloads(
    built: Any, s3_bucket: str, upload: Callable[..., str], tmp_path: Path
) -> None:
    """A fresh process opening a zarr URL dataset imports zarr on a thread at open: the import
    (0.3-0.5 s here) otherwise came after the first window's last byte, before its first batch
    (a fresh process's first batch on the shaped link: 2.0 s with it, 2.75 s without)."""
    import subprocess
    import sys

    url = upload(built.outs["zarr"], f"{s3_bucket}/ds")
    code = (
        "import sys\n"
        "from loaders import ShardDataset\n"
        "from loaders.format import zarr_reader\n"
        f"ShardDataset({url!r}, cache_dir={str(tmp_path / 'c')!r}, **{KW!r})\n"
        "for t in zarr_reader._WARMING:\n"
        "    t.join(60)\n"
        "print('zarr.storage' in sys.modules, len(zarr_reader._WARMING))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["True", "1"], out.stderr[-2000:]
