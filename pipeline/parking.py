"""What one task of a build leaves for a later task, kept in this process's memory while a byte
budget shared by the build's tasks allows, instead of in spill files (opt-in: $SHARDSMITH_PARK_MB).

Why: a spill file is written through the page cache and the file system, read back and deleted
(~0.8 CPU-s per 400 MB on this machine's ext4 against ~0.1 kept in memory: docs/PIPELINE.md,
"Memory", where the measured builds are). Only tasks that run in the build's own
process can share memory (the threading backend: `Backend.shares_memory`); elsewhere the budget is
0 and every task spills as before. A task asks for its bytes before it reads (`reserve`): granted,
it parks its arrays here; refused (the budget is taken by other tasks), it writes spill files. The
shards are the same bytes either way, so which tasks got memory never shows in the output.

A park is opened per build (keyed by its spill folder) and closed when the build ends, whatever
happened: a failed build leaves nothing behind in a long-lived process.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import ShardsmithError

# the default budget: none. Any park lets the peak grow with the source until the budget is full
# (96 MiB: +45-55 MiB at 200k cells, past make bench 4b's flatness), so it is opt-in:
# $SHARDSMITH_PARK_MB trades memory for speed (docs/PIPELINE.md, "Memory")
PARK_BYTES = 0
ENV = "SHARDSMITH_PARK_MB"


@dataclass
class _Park:
    capacity: int
    used: int = 0
    items: dict[Hashable, Any] = field(default_factory=dict)


_LOCK = threading.Lock()
_PARKS: dict[str, _Park] = {}


def open_park(spill: Path, capacity: int) -> None:
    """Open the park of the build whose spill folder is `spill` (`close_park` when it ends)."""
    with _LOCK:
        _PARKS[str(spill)] = _Park(max(0, int(capacity)))


def budget(shares_memory: bool) -> int:
    """The park's size for a build: 0 where tasks run in other processes, else $SHARDSMITH_PARK_MB
    (MiB) or `PARK_BYTES`."""
    if not shares_memory:
        return 0
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return PARK_BYTES
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not (math.isfinite(mb) and mb >= 0):
        raise ShardsmithError(
            f"${ENV}={raw!r}: expected MiB >= 0 (0: never park, spill files only)"
        )
    return int(mb * (1 << 20))


def close_park(spill: Path) -> None:
    """Drop the park and whatever is still in it (a build that failed between its phases)."""
    with _LOCK:
        _PARKS.pop(str(spill), None)


def reserve(spill: Path, nbytes: int) -> bool:
    """Take `nbytes` of the budget, or nothing (False: spill to files instead). False where no park
    is open for `spill` (a task run in another process, or a budget of 0)."""
    with _LOCK:
        park = _PARKS.get(str(spill))
        if park is None or nbytes > park.capacity - park.used:
            return False
        park.used += nbytes
        return True


def release(spill: Path, nbytes: int) -> None:
    """Give back `nbytes` taken by `reserve` (the arrays they paid for are gone or written)."""
    with _LOCK:
        park = _PARKS.get(str(spill))
        if park is not None:
            park.used = max(0, park.used - nbytes)


def put(spill: Path, key: Hashable, value: Any) -> None:
    """Leave `value` under `key` (its bytes already reserved by the task that made it)."""
    with _LOCK:
        park = _PARKS.get(str(spill))
        if park is None:  # the build ended under the task: nothing will take it
            raise RuntimeError(f"no park open for {spill}: the build that owns it has ended")
        park.items[key] = value


def take(spill: Path, key: Hashable) -> Any | None:
    """Remove and return what was left under `key`, or None if nothing was."""
    with _LOCK:
        park = _PARKS.get(str(spill))
        return None if park is None else park.items.pop(key, None)


def in_use(spill: Path) -> tuple[int, int]:
    """(bytes reserved, items waiting): what tests check."""
    with _LOCK:
        park = _PARKS.get(str(spill))
        return (0, 0) if park is None else (park.used, len(park.items))
