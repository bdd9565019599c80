"""A real S3 server for the remote tests: moto's ``moto_server`` on 127.0.0.1, as fixtures. A pytest
plug-in, registered by tests/conftest.py (``pytest_plugins``): tests take these as fixtures and
never import this module.

Why a server and not moto's in-process mock: only a real endpoint exercises what a client does
on the wire: connections and their failures, retries, conditional puts, and clients made in
subprocesses and forked children, which an in-process mock does not reach. One server per
test session (it starts in about a second); one fresh bucket per test, so tests never see each
other's objects.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The endpoint URL (``http://127.0.0.1:PORT``) of a moto S3 server for this session."""
    cmd = _moto_server()
    if cmd is None:
        pytest.skip("moto[server] is not installed: pip install -e '.[dev]' for the S3 tests")
    port = _free_port()
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
    """Point the standard AWS environment at the moto server (as a user would for an S3-compatible
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
    return env


@pytest.fixture
def s3_bucket(s3_env: dict[str, str]) -> str:
    """A fresh, empty bucket on the moto server, as ``s3://NAME``."""
    import boto3  # import weight: only the S3 tests need botocore

    name = f"t-{uuid.uuid4().hex[:20]}"
    boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture
def s3_client(s3_env: dict[str, str]) -> object:
    """A boto3 S3 client on the moto server: tests look at (and tamper with) objects through it,
    independently of the store under test."""
    import boto3  # import weight: only the S3 tests need botocore

    return boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"])
