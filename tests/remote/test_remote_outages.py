"""A server that accepts and never answers fails within the documented bound and never holds up
the exit; one that restarts within ``total_s`` is survived by the default policy. The cases are
the rows of ``tests/hostile/outages.py``.

The server here is a loopback HTTP server that speaks just enough S3 (GET and HEAD of an object,
a 404 as ``NoSuchKey``) to serve a dataset folder, and hangs on the requests it is told to:
no moto, so a hang is a real socket that never answers.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders.remote import policy as policy_module
from loaders.remote import store as store_module
from loaders.remote.policy import RemoteError, RetryPolicy
from loaders.remote.store import open_store
from pipeline.build import build
from tests import hostile

pytest.importorskip("boto3")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_REGION": "us-east-1"}
SMALL = RetryPolicy(timeout_s=1.0, connect_timeout_s=1.0, total_s=6.0, max_s=0.5)
SMALL_ENV = "timeout_s=1,connect_timeout_s=1,total_s=6,max_s=0.5"


class Loopback:
    """Serves ``folder`` as ``s3://b/ds`` on 127.0.0.1; a request whose key ``hang(key)`` holds
    is accepted and never answered (until :meth:`close`)."""

    def __init__(self, folder: Path, hang: Callable[[str], bool], port: int = 0) -> None:
        self.folder, self.hang, self.gets = folder, hang, Counter[str]()
        self.release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        box = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                key = self.path.split("?")[0].removeprefix("/b/ds/")
                box.gets[key] += 1
                if box.hang(key):
                    box.release.wait()  # accepted, never answered
                    self.close_connection = True
                    return
                path = box.folder / key
                body = path.read_bytes() if path.is_file() else None
                if body is None:
                    body = b"<Error><Code>NoSuchKey</Code><Message>none</Message></Error>"
                    self.send_response(404)
                else:
                    self.send_response(200)
                    self.send_header("ETag", f'"{len(body)}"')
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = _any

        return Handler

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def ct_tar(tmp_path_factory: pytest.TempPathFactory, ct_npy: Any) -> Path:
    """12 small CT volumes, one a tar shard (no condition table: every object is one GET)."""
    root = tmp_path_factory.mktemp("outage-ct")
    (root / "vols").mkdir()
    for i in range(12):
        vol = np.full((12, 12, 6), -1000, np.int16)
        vol[1:11, 1:11, :] = 40
        vol[3:9, 3:9, 1 : 2 + i % 5] = -850
        np.save(root / "vols" / f"v{i:02d}.npy", vol)
    text = ct_npy.manifest("tar", extra="min_points = 10")
    (root / "m.toml").write_text(text.replace("shard_size_mb = 0.05", "shard_size_mb = 0.001"))
    build(root / "m.toml", root / "out", jobs=1, progress=False)  # a shard a volume
    return root / "out"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SHARDSMITH_REMOTE_RETRY", raising=False)
    yield


# the child prints when the first error comes, and when the interpreter, exiting, has waited for
# its threads (an atexit handler registered last runs first, right after those joins): the
# machine's own teardown time (torch's, seconds under load) is not the loader's
READER = """
import atexit, json, sys, time
import boto3, botocore.session
from loaders import ShardDataset
t0 = time.time()
try:
    ds = ShardDataset("s3://b/ds", sample="ct", batch_size=1, window=1, shuffle=False,
                      decode_process=False, cache_dir=sys.argv[1])
    for _ in ds:
        pass
    print(json.dumps({"error": None}), flush=True)
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}", "t": time.time(), "t0": t0}), flush=True)
    atexit.register(lambda: print(json.dumps({"exit": time.time()}), flush=True))
"""


# -- item 8 --------------------------------------------------------------------------------------
@pytest.mark.s3
@pytest.mark.process
@hostile.parametrize
def test_a_server_that_never_answers_fails_within_the_bound(
    case: hostile.Case, ct_tar: Path, tmp_path: Path
) -> None:
    served: list[str] = []  # "shards": the first shard read is answered, every later one hangs

    def hang(key: str) -> bool:
        if case.data == "all":
            return True
        if not key.startswith("shards/") or key in served[:1]:
            return False
        served.append(key)
        return len(served) > 1

    server = Loopback(ct_tar, hang)
    env = {
        **os.environ,
        **CREDENTIALS,
        "AWS_ENDPOINT_URL": server.endpoint,
        "SHARDSMITH_REMOTE_RETRY": SMALL_ENV,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-c", READER, str(tmp_path / "cache")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        ended = time.time()
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    got, ended = lines[0], lines[-1].get("exit", ended)
    assert got["error"] and "does not answer" in got["error"], got
    bound = SMALL.bound_s()  # 8 s: retries stop at total_s, the last attempt waits its timeouts
    first = got["t"] - got["t0"]  # a read waits for its prefetch's error: not a second bound
    assert first < bound + 2.5, f"first error after {first:.1f} s, bound {bound} s: {got}"
    assert ended - got["t"] < 1.5, f"exit waited {ended - got['t']:.1f} s after the first error"
    if case.data == "shards":  # the first shard was read, the next one hung
        assert len(served) > 1 and server.gets[served[0]] == 1, server.gets


# -- item 9 --------------------------------------------------------------------------------------
class FakeTime:
    """``time`` for the store's retry loop: ``sleep`` advances ``monotonic`` instead of waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class RefusingClient:
    """A boto3 client whose connections are refused until ``up_at`` (fake time), each refusal
    taking 1 ms."""

    def __init__(self, clock: FakeTime, up_at: float) -> None:
        self.clock, self.up_at = clock, up_at

    def get_object(self, **kw: Any) -> dict[str, Any]:
        from botocore.exceptions import EndpointConnectionError

        self.clock.now += 0.001
        if self.clock.now < self.up_at:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/ds/index.json")
        return {"Body": io.BytesIO(b"{}")}


@pytest.mark.s3
@hostile.parametrize
def test_the_default_policy_outlasts_a_restart(
    case: hostile.Case, aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The defaults' arithmetic, on a fake clock (no minutes of waiting): refused connections are
    retried until ``total_s``, whatever the count of attempts."""
    outage, survives = case.data
    clock = FakeTime()
    monkeypatch.setattr(store_module, "time", clock)
    store = open_store("s3://b/ds")
    assert store.retry == RetryPolicy() and RetryPolicy().total_s == 120
    store._client = (os.getpid(), RefusingClient(clock, outage))
    if survives:
        assert store.get("index.json") == b"{}"
        assert clock.now >= outage and store.stats["retries"] > 5
        return
    with pytest.raises(RemoteError, match=r"does not answer.*gave up after \d+ attempt"):
        store.get("index.json")
    assert 100 <= clock.now <= RetryPolicy().total_s, clock.now


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.s3
@hostile.parametrize
def test_a_server_that_comes_back_is_survived(
    case: hostile.Case, ct_tar: Path, aws: None, tmp_path: Path
) -> None:
    from loaders import ShardDataset

    port = _free_port()  # nothing listens: connections are refused until the server starts
    box: list[Loopback] = []
    starter = threading.Timer(
        case.data, lambda: box.append(Loopback(ct_tar, lambda k: False, port))
    )
    starter.start()
    start = time.monotonic()
    try:
        ds = ShardDataset(
            "s3://b/ds",
            sample="ct",
            batch_size=1,
            decode_process=False,
            cache_dir=tmp_path / "cache",
            storage_options={
                "endpoint_url": f"http://127.0.0.1:{port}",
                "retry_total_s": 30,
                "retry_max_s": 0.5,
            },
        )
        assert len(list(ds)) == len(ds) > 0
        assert time.monotonic() - start >= case.data * 0.9
    finally:
        starter.join()
        for server in box:
            server.close()


def test_the_bound_is_documented() -> None:
    """docs/REMOTE.md states the bound ``bound_s`` computes, at the defaults."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "REMOTE.md").read_text()
    d = RetryPolicy()
    assert d.bound_s() == 185 and "185 s at the defaults" in text
    assert policy_module.RetryPolicy is RetryPolicy
