"""A DataLoader worker is a fork of the training process, taken while its decode threads may be
inside zarr."""

from __future__ import annotations

import os
import signal
import time

import pytest

import loaders.format.readers  # noqa: F401  (registers the at-fork reset under test)


def _child_finishes(work: object) -> None:
    """Fork; the child runs ``work()`` and must exit 0 within 20 s (a hang is the bug)."""
    pid = os.fork()
    if pid == 0:
        try:
            work()  # type: ignore[operator]
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
    pytest.fail("the forked child hung on a lock its parent held at the fork")


@pytest.mark.process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_zarrs_loop_lock_is_held_can_still_use_zarr() -> None:
    import zarr.core.sync as sync

    lock = sync._get_lock()
    lock.acquire()  # as a decode thread does while it creates zarr's event loop
    try:
        _child_finishes(sync._get_loop)  # the child: zarr's loop was reset by zarr, its lock by us
    finally:
        lock.release()


@pytest.mark.process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_while_a_decode_thread_parses_an_npy_header_can_parse_one() -> None:
    """Seen in CI: a DataLoader forked its workers while a thread of the training process held the
    .npy header lock; both workers' decode threads then waited on it forever."""
    import io

    import numpy as np

    from loaders.format import tar_reader

    buf = io.BytesIO()
    np.save(buf, np.arange(3))
    head = buf.getvalue()

    def parse() -> None:
        fh = io.BytesIO(head)
        version = np.lib.format.read_magic(fh)
        assert tar_reader.read_npy_header(fh, version)[0] == (3,)

    # as a decode thread of the parent does at the moment of the fork
    with tar_reader.NPY_HEADER_LOCK:
        _child_finishes(parse)


def test_an_exception_while_entering_the_lock_does_not_leave_it_held() -> None:
    """A signal handler can raise inside a Python-level ``__enter__``, after its ``acquire()``
    (torch's SIGCHLD check raises when a DataLoader worker dies): no ``__exit__`` runs, and with
    a wrapper class the lock stayed held forever (a ring receive hung in CI). The trace function
    raises at every return of a frame of loaders/format/forksafe.py, as such a handler would; the
    module's locks have no such frame to raise in."""
    import sys

    from loaders.engine import ring
    from loaders.format import forksafe, tar_reader

    def tracer(frame: object, event: str, arg: object) -> object:
        if event == "return" and frame.f_code.co_filename.endswith("forksafe.py"):  # type: ignore[attr-defined]
            raise RuntimeError("raised by a signal handler")
        return tracer

    for lock in (forksafe.fork_safe_lock(), ring._LOCK, tar_reader.NPY_HEADER_LOCK):
        sys.settrace(tracer)
        try:
            with lock:
                pass
        except RuntimeError:
            pass
        finally:
            sys.settrace(None)
        assert not lock.locked()
