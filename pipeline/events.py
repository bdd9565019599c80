"""Machine-readable build log: one JSON object per line, per event (`shardsmith build --log-json FILE`).

Why: a nightly scheduler must tell "rebuilt" from "nothing to do" from "failed" without parsing prose, and
a person reading last night's log wants the same facts (which shards were written, how long each stage took,
what went wrong). Every object has ``event`` and ``t`` (seconds since the build started); the last one of a
run is always ``summary`` (also printed as the CLI's last stdout line), with ``changed`` and ``exit_code``.

Events (fields beyond ``event``/``t``):

* ``start``: manifest, out, backend, jobs, dry_run
* ``up_to_date``: shards (a no-change rebuild: nothing read, planned or written)
* ``scanned``: sources, seconds
* ``planned``: shards, write, reuse, delete (counts), seconds
* ``tasks``: phase, count, max_descriptor_bytes (what each task is sent: paths and row ranges)
* ``shard``: file, records, bytes, seconds_since_start (one per shard written)
* ``committed``: shards, written, reused, removed
* ``warning``: message (every warning the pipeline logs, e.g. dropped cells)
* ``error``: type, message, exit_code
* ``summary``: status, changed, exit_code, written, reused, removed, bytes_written, seconds, out, dry_run
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


class EventLog:
    """Writes events as JSON lines to a file (appended, flushed per event) or a stream; `None` discards."""

    def __init__(self, target: str | Path | IO[str] | None = None) -> None:
        self.t0 = time.perf_counter()
        self.events: list[dict[str, Any]] = []  # kept for the caller (the summary, tests)
        self._own = False
        self._fh: IO[str] | None
        if target is None:
            self._fh = None
        elif target == "-":
            self._fh = sys.stderr
        elif isinstance(target, (str, Path)):
            self._fh = open(target, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
            self._own = True
        else:
            self._fh = target

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        doc = {"event": event, "t": round(time.perf_counter() - self.t0, 4), **fields}
        self.events.append(doc)
        if self._fh is not None:
            self._fh.write(json.dumps(doc, sort_keys=False, default=str) + "\n")
            self._fh.flush()
        return doc

    def close(self) -> None:
        if self._own and self._fh is not None:
            self._fh.close()
        self._fh = None

    @contextmanager
    def capture_warnings(self, logger: str = "pipeline") -> Iterator[None]:
        """Forward the pipeline's warnings (and errors) to the log as ``warning`` events while inside."""
        handler = _Forward(self)
        log = logging.getLogger(logger)
        log.addHandler(handler)
        try:
            yield
        finally:
            log.removeHandler(handler)


class _Forward(logging.Handler):
    def __init__(self, events: EventLog) -> None:
        super().__init__(logging.WARNING)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        self.events.emit("warning", logger=record.name, message=record.getMessage())


NULL = EventLog(None)


def summary_line(doc: dict[str, Any]) -> str:
    """The summary event as one line of JSON: what a scheduler parses from the last line of stdout."""
    return json.dumps(doc, sort_keys=False, default=str)
