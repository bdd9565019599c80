"""A DataLoader worker is a fork of the training process, taken while its decode threads may be inside zarr."""

from __future__ import annotations

import os
import signal
import time

import pytest

import loaders.shardio  # noqa: F401  (registers the at-fork reset under test)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_zarrs_loop_lock_is_held_can_still_use_zarr() -> None:
    import zarr.core.sync as sync

    lock = sync._get_lock()
    lock.acquire()  # as a decode thread does while it creates zarr's event loop
    try:
        pid = os.fork()
        if pid == 0:  # the child: zarr's loop was reset by zarr, its lock by us
            try:
                sync._get_loop()
                os._exit(0)
            except BaseException:
                os._exit(3)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on zarr's inherited lock")
    finally:
        lock.release()
