"""Decoded windows a process still serves, shared by every request for the same shards.

With ``window >= n_shards`` every epoch is one window of the same shards: while the last epoch's
batches are served, the next epoch's first window asks for exactly those shards again. Keeping
the decoded window (keyed by its sorted shard ids, reference-counted by the views handed out)
lets that request re-order it instead of decoding the split again. The registry belongs to one
process: after a fork it starts empty.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from loaders.engine.transport import Arena

Key = tuple[int, ...]


class LiveWindows:
    """Reference-counted decoded windows by shard set; the last view released hands the arena to
    ``release``."""

    def __init__(self, release: Callable[[Arena], None]) -> None:
        self.pid = os.getpid()
        self._release = release
        self._entries: dict[Key, list[object]] = {}  # key -> [arena, references]
        self._lock = threading.Lock()

    def claim(self, key: Key) -> list[object] | None:
        """Take a reference on the live window of these shards, or None: none is live."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry[1] += 1  # type: ignore[operator]
        return entry

    def add(self, key: Key, arena: Arena) -> list[object]:
        """Register a freshly decoded window (one reference: its first view). A concurrent decode of
        the same shards keeps its own entry."""
        entry: list[object] = [arena, 1]
        with self._lock:
            self._entries.setdefault(key, entry)
        return entry

    def view(self, key: Key, entry: list[object], order: np.ndarray) -> Arena:
        """A view of ``entry``'s arena in ``order``; releasing it drops the reference."""
        arena: Arena = entry[0]  # type: ignore[assignment]
        return arena.view(order, lambda: self._unref(key, entry))

    def _unref(self, key: Key, entry: list[object]) -> None:
        with self._lock:
            entry[1] -= 1  # type: ignore[operator]
            if entry[1]:
                return
            if self._entries.get(key) is entry:
                del self._entries[key]
        self._release(entry[0])  # type: ignore[arg-type]
