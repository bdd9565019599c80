"""``shardsmith verify|inspect|export`` on a dataset URL, and a ShardDataset given bad remote
input: a clear error naming the URL and the fix (exit 2 for the CLI), within the retry bound."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardDataset
from loaders.format import FormatError
from tests import hostile

pytestmark = [pytest.mark.process, pytest.mark.s3]  # an S3 server (SeaweedFS); the CLI and the decoder process

BOUND = {"SHARDSMITH_REMOTE_RETRY": "attempts=2,total_s=4,timeout_s=2,connect_timeout_s=1"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]) -> Any:
    return build_dataset(tmp_path_factory.mktemp("cli"), formats=("tar",), n_shards=4)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **BOUND, **(env or {})},
    )


@hostile.parametrize
def test_verify_inspect_export_a_url(
    case: hostile.Case,
    built: Any,
    s3_proxy: Any,
    s3_bucket: str,
    s3_client: Any,
    upload: Callable[..., str],
    tmp_path: Path,
) -> None:
    url = upload(built.outs["tar"], f"{s3_bucket}/ds")
    env = {"SHARDSMITH_CACHE": str(tmp_path / "cache")}
    r = cli("verify", url, env=env)
    assert r.returncode == 0 and f"{url}: OK" in r.stdout, r.stderr
    r = cli("inspect", url, "--json", env=env)
    assert r.returncode == 0 and '"train"' in r.stdout, r.stderr
    r = cli("export", url, str(tmp_path / "val.h5ad"), "--split", "train", env=env)
    assert r.returncode == 0 and (tmp_path / "val.h5ad").exists(), r.stderr
    # a damaged object: verify names it (exit 1), on a fresh cache
    bucket = s3_bucket.removeprefix("s3://")
    key = f"ds/shards/{ShardDataset(built.outs['tar']).entries[0].file}"
    s3_client.put_object(Bucket=bucket, Key=key, Body=b"not a shard")
    r = cli("verify", url, env={"SHARDSMITH_CACHE": str(tmp_path / "cache2")})
    assert r.returncode == 1 and key in r.stderr and "digest" in r.stderr, r.stderr


@hostile.parametrize
def test_bad_remote_input_is_exit_2_naming_url_and_fix(
    case: hostile.Case, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3_bucket}/nothing-here"
    if case.data == "no-bucket":
        url = "s3://no-such-bucket-shardsmith/ds"
    elif case.data == "no-credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    elif case.data == "unreachable":
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    for k, v in BOUND.items():
        monkeypatch.setenv(k, v)
    t0 = time.monotonic()
    r = cli("verify", url, env={"SHARDSMITH_CACHE": str(tmp_path / "c")})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert url.split("/")[2] in r.stderr and ";" in r.stderr, r.stderr  # the URL, then the fix
    assert time.monotonic() - t0 < 60
    with pytest.raises(FormatError, match=url.split("/")[2]):
        ShardDataset(url, cache_dir=tmp_path / "c2")
