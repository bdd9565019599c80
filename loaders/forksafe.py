"""A module-level lock that a forked child gets back unlocked.

Why: a DataLoader worker is a fork of the training process, taken while the training process's threads
(window decodes ahead of use, the previous loader's speculative decode) may be inside a lock. The child has
a copy of the lock in its held state and no thread that will ever release it: its first decode waits forever
(seen: two workers of a test hung on the .npy header lock, each decode thread waiting on it).
"""

from __future__ import annotations

import os
import threading
from typing import Any


class ForkSafeLock:
    """``with lock:`` as with :class:`threading.Lock`; after a fork the child starts with a fresh one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> ForkSafeLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()
