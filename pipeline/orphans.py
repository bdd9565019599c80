"""Worker processes must not outlive a killed build.

A loky worker blocked on its task queue does not notice that the build that started it died
(`kill -9`, an OOM kill): it stayed for minutes, holding memory and open files in OUT (issue 13,
case 6). Each task for a worker process is therefore wrapped (`watched`): the first one a worker
runs starts a daemon thread that polls the worker's parent pid once a second and ends the worker
when it is no longer the build's (the orphan was re-parented). No signal setup is needed
(PR_SET_PDEATHSIG follows the creating *thread*, which in loky is not the main one), and a task
run in the build's own process starts no watcher.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

POLL_S = 1.0
_started = False


def watched(task: Callable[[], Any]) -> Callable[[], Any]:
    """``task``, run by `_run_watched` with this (the build's) pid: picklable when ``task`` is."""
    return partial(_run_watched, task, os.getpid())


def _run_watched(task: Callable[[], Any], build_pid: int) -> Any:
    global _started
    if not _started and os.getpid() != build_pid:  # in a worker process, once
        _started = True
        threading.Thread(
            target=_watch, args=(build_pid,), daemon=True, name="shardsmith-parent-watch"
        ).start()
    return task()


def _watch(build_pid: int) -> None:
    while os.getppid() == build_pid:
        time.sleep(POLL_S)
    os._exit(1)  # the build is gone: nobody will read this worker's results
