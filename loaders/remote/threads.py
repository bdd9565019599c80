"""Reading threads that never hold up an exit: an ``Executor`` whose workers are daemon threads.

Why not ``ThreadPoolExecutor``: its workers are joined when the interpreter exits, so a process
whose reads hang on a server that accepts and never answers waited for every queued prefetch and
decode-ahead to time out before it could exit (issue 45, item 8: the first error after 240 s, exit
after 482 s). The threads that read ahead (a remote dataset's downloads,
``loaders.remote.cache``; the window decoded ahead and its shards, ``loaders.engine.process``) only
ever guess what is read next: when the process is done, what is still in flight is abandoned. A
download writes to a temporary name and renames only a whole, checked shard, so nothing
half-written is left for anyone to read (the next download of that shard removes the temporary
file); a window decoded ahead lives in this process's memory.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonExecutor(Executor):
    """Up to ``workers`` daemon threads named ``<name>_<n>``, started as work arrives; ``map``
    and the rest of ``Executor`` come from ``submit``."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers, self._name = max(1, int(workers)), name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: cannot submit after shutdown")
            self._queue.put((future, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self._workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                thread.start()  # RuntimeError at interpreter exit: the caller gives up prefetching
                self._threads.append(thread)
            else:
                self._idle = max(0, self._idle - 1)
        return future

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            future, fn, args, kwargs = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # the caller of result() sees it
                    future.set_exception(e)
            # no reference to the last job (its function may hold the engine), result or error kept
            # while idle: the engine's finalizers (the decoder process's close) must run once it is dropped
            del job, future, fn, args, kwargs
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new work; with ``wait``, join the threads after the queued work (never at exit)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for t in threads:
                t.join()
