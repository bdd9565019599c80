"""A module-level lock that a forked child gets back unlocked.

Why: a DataLoader worker is a fork of the training process, taken while the training process's
threads (window decodes ahead of use, the previous loader's speculative decode) may be inside a
lock. The child has a copy of the lock in its held state and no thread that will ever release it:
its first decode waits forever (seen: two workers of a test hung on the .npy header lock, each
decode thread waiting on it).

The lock is a plain :class:`threading.Lock` (its C ``__enter__``), not a wrapper class with a
Python ``__enter__``: a Python-level signal handler (torch's SIGCHLD check raises when a
DataLoader worker dies) can raise between a Python ``__enter__``'s ``acquire()`` and its return.
The ``with`` block is then never entered, its ``__exit__`` never runs, and the lock stays held
for the life of the process (seen once in a fresh-clone CI: a ring receive waited forever on a
lock no thread held). The child's copy is released after a fork (a ``threading.Lock`` may be
released by any thread).
"""

from __future__ import annotations

import os
import threading
from functools import partial


def _release_if_held(lock: threading.Lock) -> None:
    if lock.locked():
        lock.release()


def fork_safe_lock() -> threading.Lock:
    """A ``threading.Lock`` that a forked child gets unlocked (see the module docstring)."""
    lock = threading.Lock()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=partial(_release_if_held, lock))
    return lock
