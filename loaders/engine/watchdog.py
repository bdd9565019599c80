"""No hangs with DataLoader workers: the loader's ``timeout`` covers every wait on a worker.

torch's own ``timeout`` covers only the wait for a worker's *message*. A batch's tensors then
travel as file descriptors that the main process fetches from the worker (``file_descriptor``
sharing): from a stopped (SIGSTOP) or stuck worker that fetch blocks forever, whatever
``timeout`` says, and at exit multiprocessing joins the stopped worker forever too. So a watchdog
thread watches each wait for a batch: past ``timeout`` it SIGKILLs the workers (a stopped process
ignores anything else), which wakes the main thread (torch's SIGCHLD handler raises, or the fetch
reads EOF), and the loader raises :class:`LoaderTimeout` naming the stopped ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

SLACK_S = 0.5  # torch's own timeout fires first when it can; the watchdog covers what it cannot
STUCK_STATES = (
    "T",
    "t",
    "D",
)  # /proc states of a stopped, traced or uninterruptibly sleeping process


class LoaderTimeout(RuntimeError):
    """A DataLoader worker sent no batch within the loader's ``timeout`` (stopped or stuck); workers
    were killed."""


def proc_state(pid: int) -> str:
    """A process's state as /proc says it ("T" stopped, "D" uninterruptible, ...), or "?"."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


class WorkerWatch:
    """Iterate torch's multiprocessing iterator ``it`` with every wait for a batch bounded by
    ``timeout``."""

    def __init__(self, it: Any, timeout: float) -> None:
        self.it, self.timeout = it, float(timeout)
        self.late: list[str] = []  # "pid (state)" of the workers found stopped or stuck, once fired
        self.fired = False
        self._since: float | None = None
        self._stop = threading.Event()

    def __iter__(self) -> Iterator[Any]:
        thread = threading.Thread(target=self._watch, name="shard-worker-watchdog", daemon=True)
        thread.start()
        try:
            while True:
                self._since = time.monotonic()
                try:
                    batch = next(self.it)
                except StopIteration:
                    return
                self._since = None
                yield batch
        finally:
            self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            since = self._since
            if since is not None and time.monotonic() - since > self.timeout + SLACK_S:
                self.fired = True
                self.kill(
                    shutdown=False
                )  # wakes the main thread; it shuts torch's iterator down itself
                return

    def workers(self) -> list[Any]:
        return list(getattr(self.it, "_workers", []))

    def kill(self, shutdown: bool = True) -> list[str]:
        """SIGKILL the workers still alive; remember the stopped or stuck ones as "pid (state)"."""
        for w in self.workers():
            if w.is_alive():
                state = proc_state(w.pid)
                if state in STUCK_STATES and f"{w.pid} ({state})" not in self.late:
                    self.late.append(f"{w.pid} ({state})")
                w.kill()
        if shutdown:
            from torch.utils.data._utils import (
                signal_handling,  # torch internals, only once a worker has died
            )

            if getattr(
                self.it, "_worker_pids_set", False
            ):  # torch's SIGCHLD handler: our kills are no news
                signal_handling._remove_worker_pids(id(self.it))
                self.it._worker_pids_set = False
            for w in self.workers():
                w.join(timeout=5)
            stop = getattr(self.it, "_shutdown_workers", None)
            if stop is not None:
                stop()
        return self.late

    def timed_out(self, error: BaseException) -> LoaderTimeout | None:
        """``error`` raised while iterating, as a LoaderTimeout if it was a timeout (torch's or
        ours)."""
        if not self.fired and "DataLoader timed out" not in str(error):
            return None
        late = self.kill()
        who = ", ".join(late) or ", ".join(f"{w.pid}" for w in self.workers()) or "?"
        return LoaderTimeout(
            f"DataLoader worker(s) {who} sent no batch within timeout={self.timeout:g} s "
            "(pid (state): T = stopped, D = stuck in I/O); all workers were killed "
            "(ShardLoader(timeout=...) sets this bound, timeout=None removes it)"
        )
