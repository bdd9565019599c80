"""Reading a dataset from S3 (a SeaweedFS server) through the node cache: the same batches as the local
folder, each shard object downloaded once per node, none on a warm cache (docs/REMOTE.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardDataset
from loaders.remote.ledger import cache_bytes
from tests import hostile

pytestmark = [
    pytest.mark.s3,
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]  # an S3 server (SeaweedFS) (tests/remote/conftest.py)
KW: dict[str, Any] = {"split": "train", "batch_size": 64, "window": 2, "seed": 3}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]) -> Any:
    return build_dataset(tmp_path_factory.mktemp("remote"), formats=("zarr", "tar"), n_shards=6)


@pytest.mark.process
@pytest.mark.parametrize("enc", ["zarr", "tar"])
def test_push_then_read_equals_local(
    enc: str,
    built: Any,
    s3_proxy: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    batches: Callable[..., Any],
    assert_same: Callable[..., None],
) -> None:
    url = upload(built.outs[enc], f"{s3_bucket}/datasets/{enc}")
    local = batches(ShardDataset(built.outs[enc], **KW))
    s3_proxy.requests.clear()
    ds = ShardDataset(url, cache_dir=tmp_path / "cache", **KW)
    assert_same(batches(ds), local)
    gets = s3_proxy.gets()  # two epochs: every object of every shard fetched once
    assert gets and max(gets.values()) == 1, gets
    # a second process on the warm cache: no shard GET
    s3_proxy.requests.clear()
    assert_same(batches(ShardDataset(url, cache_dir=tmp_path / "cache", **KW)), local)
    assert s3_proxy.gets() == {}
    assert cache_bytes(tmp_path / "cache") == sum(e.bytes for e in ds.entries)
    # DataLoader workers on a fresh cache: the same batches, each object still fetched once
    s3_proxy.requests.clear()
    ds = ShardDataset(url, cache_dir=tmp_path / "cache2", **KW)
    assert_same(batches(ds, num_workers=2, multiprocessing_context="fork"), local)
    assert max(s3_proxy.gets().values()) == 1


@pytest.mark.process
def test_two_processes_on_a_fresh_cache_fetch_each_object_once(
    built: Any, s3_proxy: Any, s3_bucket: str, upload: Callable[..., str], tmp_path: Path
) -> None:
    url = upload(built.outs["zarr"], f"{s3_bucket}/ds")
    code = textwrap.dedent(
        f"""
        import sys, warnings
        warnings.simplefilter("ignore")
        from loaders import ShardDataset, ShardLoader
        ds = ShardDataset({url!r}, cache_dir=sys.argv[1], rank=int(sys.argv[2]), world_size=2,
                          **{KW!r})
        print(sum(int(b["X"].shape[0]) for b in ShardLoader(ds)))
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "cache"), str(r)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    gets = s3_proxy.gets()
    assert gets and max(gets.values()) == 1, gets


@hostile.parametrize
def test_tampered_object_is_caught(
    case: hostile.Case,
    built: Any,
    s3_proxy: Any,
    s3_bucket: str,
    s3_client: Any,
    upload: Callable[..., str],
    tmp_path: Path,
) -> None:
    url = upload(built.outs["tar"], f"{s3_bucket}/ds")
    bucket = s3_bucket.removeprefix("s3://")
    train = ShardDataset(built.outs["tar"], **KW).entries[0].file
    key = f"ds/shards/{train}"
    body = bytearray(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3_client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    ds = ShardDataset(url, cache_dir=tmp_path / "cache", decode_process=False, **KW)
    with pytest.raises(Exception, match="downloaded twice.*digest") as err:
        list(ds)
    assert key.removeprefix("ds/") in str(err.value)
    assert s3_proxy.gets()[f"/{bucket}/{key}"] == 2  # retried once
    assert not list((tmp_path / "cache").rglob(".tmp/*")) and not any(
        p.name.endswith(Path(key).name) for p in (tmp_path / "cache").rglob("shards/*")
    )


@pytest.mark.parametrize("s3_server", ["seaweedfs", "moto"], indirect=True)
@pytest.mark.process
@hostile.parametrize
def test_faults_between_loader_and_server_give_identical_batches(
    case: hostile.Case,
    built: Any,
    s3_proxy: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    batches: Callable[..., Any],
    assert_same: Callable[..., None],
) -> None:
    url = upload(built.outs["zarr"], f"{s3_bucket}/ds")
    local = batches(ShardDataset(built.outs["zarr"], **KW))
    plan = {3: "drop", 5: "500", 8: "cut", 11: "stall", 13: "500", 17: "drop"}
    n_get = [0]

    def fault(method: str, path: str, n: int) -> str | None:
        if method != "GET" or "/shards/" not in path:
            return None
        n_get[0] += 1
        return plan.get(n_get[0])

    s3_proxy.fault, s3_proxy.stall_s = fault, 3.0
    opts = {"retry_timeout_s": 1.5, "retry_base_s": 0.05}
    ds = ShardDataset(url, cache_dir=tmp_path / "cache", storage_options=opts, **KW)
    assert_same(batches(ds), local)
    assert set(s3_proxy.faults) == {"drop", "500", "cut", "stall"}, s3_proxy.faults
