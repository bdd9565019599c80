"""A real torch.distributed world on this machine for tests: ranks spawned as processes that meet
over gloo on 127.0.0.1, run under a deadline so a rank that blocks in a collective fails the test
instead of hanging it. Registered in tests/conftest.py's ``pytest_plugins``."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch.multiprocessing as tmp


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the world's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(main: Callable[..., None], world: int, *args: Any, deadline: float) -> None:
    """Run ``main(rank, world, port, *args)`` in ``world`` spawned processes; fail the test when
    they have not all finished within ``deadline`` seconds (and kill the ones still alive)."""
    ctx = tmp.start_processes(
        main, args=(world, free_port(), *args), nprocs=world, join=False, start_method="spawn"
    )
    end = time.monotonic() + deadline
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > end:
                pytest.fail(f"a world of {world} ranks did not finish within {deadline}s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()


@pytest.fixture
def gloo_world() -> Callable[..., None]:
    """:func:`run_world`: ``gloo_world(main, world, *args, deadline=...)``."""
    return run_world
