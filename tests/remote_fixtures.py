"""Fixtures of the remote-read tests: a dataset folder uploaded under a URL, and an HTTP proxy in
front of the S3 server that counts requests and injects faults (dropped connections, 500s,
stalls). A pytest plug-in registered by tests/conftest.py: tests take these as fixtures.

Why a proxy: the loader's processes (decoder process, DataLoader workers, other ranks) each make
their own requests; only a point every request passes through can count them all (no shard GET on
a warm cache, each object fetched once per node) or break them on purpose.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

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
