"""loaders.remote.store against a real S3 server (SeaweedFS; moto too for the store, tests/remote/conftest.py): the key -> bytes
store that push and the remote reader share, its errors and its bounds."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from loaders.remote import RemoteError, RemoteNotFound, RetryPolicy, is_url, open_store
from tests import hostile

# the store's contract and its fault handling, on both servers the tests run (tests/remote/conftest.py)
BOTH_SERVERS = pytest.mark.parametrize("s3_server", ["seaweedfs", "moto"], indirect=True)


def test_is_url() -> None:
    assert is_url("s3://bucket/prefix/ds") and is_url("S3://b/x")
    assert not is_url("shards/demo") and not is_url("file:///tmp/ds") and not is_url("/abs")
    assert not is_url("gs://b/x")  # not served: the error names the schemes that are
    assert not is_url(Path("s3://bucket/x"))  # a Path is local, whatever its text


@BOTH_SERVERS
@pytest.mark.s3
def test_round_trip_list_head_and_stats(s3_bucket: str, tmp_path: Path) -> None:
    store = open_store(f"{s3_bucket}/team/ds")
    store.put("index.json", b"{}")
    src = tmp_path / "a.tar"
    src.write_bytes(b"x" * 1000)
    assert store.put_file("shards/a.tar", src) == 1000
    assert sorted(o.key for o in store.list()) == ["index.json", "shards/a.tar"]
    assert [o.key for o in store.list("shards/")] == ["shards/a.tar"]
    info = store.head("shards/a.tar")
    assert info is not None and info.size == 1000 and info.etag
    assert store.head("shards/missing.tar") is None
    assert store.get_to_file("shards/a.tar", tmp_path / "b") == 1000
    assert (tmp_path / "b").read_bytes() == src.read_bytes()
    assert store.get("index.json") == b"{}"
    assert store.stats["get_requests"] == 2 and store.stats["get_bytes"] == 1002
    assert store.stats["put_requests"] == 2
    store.delete("index.json")
    store.delete("index.json")  # gone already: fine
    assert store.head("index.json") is None


@BOTH_SERVERS
@pytest.mark.s3
def test_put_if_absent_is_conditional(s3_bucket: str) -> None:
    store = open_store(f"{s3_bucket}/ds")
    assert store.put_if_absent("lock", b"one")
    assert not store.put_if_absent("lock", b"two")
    assert store.get("lock") == b"one"


@BOTH_SERVERS
@pytest.mark.process
@pytest.mark.s3
def test_pickled_store_makes_its_own_client(s3_bucket: str) -> None:
    store = open_store(f"{s3_bucket}/ds", {"retry_attempts": 2})
    store.put("k", b"v")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.retry.attempts == 2 and copy._client is None
    assert copy.get("k") == b"v"
    pid = os.fork()
    if pid == 0:  # the child uses the parent's store: a fresh client, not the inherited one
        os._exit(0 if store.get("k") == b"v" and store._client[0] == os.getpid() else 1)
    assert os.waitpid(pid, 0)[1] == 0


@BOTH_SERVERS
@pytest.mark.s3
def test_missing_object_and_bucket_name_the_url(s3_bucket: str) -> None:
    with pytest.raises(RemoteNotFound, match=f"{s3_bucket}/ds/index.json: GET: no such object"):
        open_store(f"{s3_bucket}/ds").get("index.json")
    with pytest.raises(RemoteNotFound, match="s3://no-such-bucket-x/ds: LIST: the bucket does not"):
        list(open_store("s3://no-such-bucket-x/ds").list())


@pytest.mark.s3
@hostile.parametrize
def test_unreachable_endpoint_fails_within_the_bound(
    case: hostile.Case, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on port 9
    store = open_store("s3://b/ds", retry=RetryPolicy(attempts=3, base_s=0.05, total_s=2))
    start = time.monotonic()
    with pytest.raises(RemoteError, match=r"s3://b/ds/index.json: GET: the endpoint does not"):
        store.get("index.json")
    assert time.monotonic() - start < 5


@pytest.mark.s3
def test_no_credentials_is_clear(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "")
    with pytest.raises(RemoteError, match="s3://b/ds.*credentials.*AWS_ACCESS_KEY_ID"):
        open_store("s3://b/ds").get("index.json")


def test_retry_policy_parse() -> None:
    assert RetryPolicy.parse("attempts=2, total_s=5") == RetryPolicy(attempts=2, total_s=5.0)
    with pytest.raises(ValueError, match="unknown setting 'tries'"):
        RetryPolicy.parse("tries=2")


@BOTH_SERVERS
@pytest.mark.s3
@pytest.mark.parametrize("fault", ["500", "drop", "cut", "stall"])
def test_transient_faults_are_retried(s3_bucket: str, s3_proxy: Any, fault: str) -> None:
    """Through the fault proxy (tests/remote/conftest.py): the first two GETs of the object fail
    (a 500, a dropped connection, a body cut in half, an answer later than the read timeout)."""
    store = open_store(f"{s3_bucket}/ds", retry=RetryPolicy(base_s=0.01, timeout_s=1))
    blob = os.urandom(300_000)
    store.put("shards/a.tar", blob)
    seen = {"n": 0}

    def inject(method: str, path: str, n: int) -> str | None:
        if method == "GET" and path.endswith("/ds/shards/a.tar"):
            seen["n"] += 1
            return fault if seen["n"] <= 2 else None
        return None

    s3_proxy.stall_s = 2.0
    s3_proxy.fault = inject
    assert store.get("shards/a.tar") == blob
    assert store.stats["retries"] == 2 and s3_proxy.faults[fault] == 2


@BOTH_SERVERS
@pytest.mark.s3
@hostile.parametrize
def test_retries_are_bounded_and_not_found_is_not_retried(
    case: hostile.Case, s3_bucket: str, s3_proxy: Any
) -> None:
    store = open_store(f"{s3_bucket}/ds", retry=RetryPolicy(attempts=3, base_s=0.01))
    store.put("k", b"v")
    s3_proxy.fault = lambda m, p, n: "500" if m == "GET" else None
    start = time.monotonic()
    with pytest.raises(RemoteError, match=r"/ds/k: GET failed.*gave up after 3 attempt"):
        store.get("k")
    assert time.monotonic() - start < 5 and store.stats["retries"] == 2
    s3_proxy.reset()
    with pytest.raises(RemoteNotFound):
        store.get("missing")
    assert store.stats["retries"] == 2, "a missing object is an answer: never retried"
