"""Machine-readable build log: one JSON object per line, per event (`shardsmith build --log-json
FILE`).

Why: a nightly scheduler must tell "rebuilt" from "nothing to do" from "failed" without parsing
prose, and a person reading last night's log wants the same facts (which shards were written, how
long each stage took, what went wrong). Every object has ``event`` and ``t`` (seconds since the
build started); the last one of a run is always ``summary`` (also printed as the CLI's one stdout
line with ``build --json``), with ``changed`` and ``exit_code``.

Events (fields beyond ``event``/``t``):

* ``start``: manifest, out, backend, jobs, dry_run
* ``up_to_date``: shards (a no-change rebuild: nothing read, planned or written)
* ``scanned``: sources, seconds
* ``planned``: shards, write, reuse, delete (counts), seconds; ``pipelined: true`` when the sources
  were planned while the first ones were packed ($SHARDSMITH_PIPELINE_PLAN=1): it then comes last
* ``tasks``: phase, count, max_descriptor_bytes (what each task is sent: paths and row ranges)
* ``shard``: file, records, bytes, seconds_since_start (one per shard written)
* ``committed``: shards, written, reused, removed
* ``warning``: message (every warning the pipeline logs, e.g. dropped cells)
* ``error``: type, message, exit_code
* ``summary``: status, changed, exit_code, written, reused, removed, bytes_written, seconds, out,
dry_run
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from loaders.format import FormatError
from pipeline.errors import EXIT_BAD_INPUT, EXIT_CRASH, EXIT_OK, ShardsmithError
from pipeline.verify import summary


class EventLog:
    """Writes events as JSON lines to a file (appended, flushed per event) or a stream; `None`
    discards."""

    def __init__(self, target: str | Path | IO[str] | None = None) -> None:
        self.t0 = time.perf_counter()
        self.events: list[dict[str, Any]] = []  # kept for the caller (the summary, tests)
        self._lock = threading.Lock()
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
        line = json.dumps(doc, sort_keys=False, default=str) + "\n"
        with self._lock:  # a pipelined build's plan emits from a worker thread (pipeline.pipelined)
            self.events.append(doc)
            if self._fh is not None:
                self._fh.write(line)
                self._fh.flush()
        return doc

    def close(self) -> None:
        if self._own and self._fh is not None:
            self._fh.close()
        self._fh = None

    @contextmanager
    def capture_warnings(self, logger: str = "pipeline") -> Iterator[None]:
        """Forward the pipeline's warnings (and errors) to the log as ``warning`` events while
        inside."""
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


@dataclass
class Report:
    """What `reported` fills in: the event log to pass to the build, and the build's result."""

    events: EventLog
    result: Any = None
    stdout: bool = True  # print the summary on stdout (build --json)


@contextmanager
def reported(
    log_json: str | None, out: Path | str | None, stdout: bool = True
) -> Iterator[Report]:
    """Run a build inside: its warnings become events; at the end, success or not, the ``summary``
    event is logged and, with ``stdout`` (``build --json``), printed as a line of stdout (one JSON
    object: the only one there). An exception is logged as an ``error`` event with its exit code
    (``exit_code`` attribute, else 2 for bad input, else 1) and raised again, so the CLI prints it
    and exits with that code."""

    report = Report(EventLog(log_json), stdout=stdout)
    try:
        with report.events.capture_warnings():
            yield report
    except BaseException as e:
        code = getattr(
            e,
            "exit_code",
            EXIT_BAD_INPUT if isinstance(e, (ShardsmithError, FormatError)) else EXIT_CRASH,
        )
        if isinstance(e, KeyboardInterrupt):
            code = 128 + 2
        report.events.emit("error", type=type(e).__name__, message=str(e), exit_code=code)
        _finish(report, summary_doc(None, out, code))
        raise
    _finish(report, summary_doc(report.result, out, EXIT_OK))


def _finish(report: Report, doc: dict[str, Any]) -> None:
    line = report.events.emit("summary", **doc)
    report.events.close()
    if report.stdout:
        print(json.dumps(line, default=str), flush=True)


def summary_doc(result: Any, out: Path | str | None, exit_code: int) -> dict[str, Any]:
    """The summary's fields. `changed` is about the committed dataset: a failed build commits
    nothing. ``out`` as the user gave it: a URL (``--out s3://...``) is the summary's ``out``,
    and the folder the build was staged in its ``staged``."""
    if result is None:
        return {
            "status": "failed",
            "changed": False,
            "exit_code": exit_code,
            "out": str(out) if out else None,
        }
    doc: dict[str, Any] = {
        "status": "dry-run" if result.difference is not None else "ok",
        "changed": bool(result.changed),
        "exit_code": exit_code,
        "out": out if isinstance(out, str) else str(result.out),
        **({"staged": str(result.out)} if isinstance(out, str) else {}),
        "written": len(result.written),
        "reused": len(result.reused),
        "removed": result.removed,
        "seconds": round(result.seconds.get("total", 0.0), 3),
    }
    if result.difference is not None:
        doc.update(result.difference.to_json())
        doc.pop("files")
    else:
        written = set(result.written)
        doc["bytes_written"] = sum(
            int(s.get("bytes", 0))
            for s in result.index.get("shards", [])
            if s.get("file") in written
        )

        doc["warnings"] = summary(result.out)[
            "warnings"
        ]  # the kind's counted weak spots, as `inspect` prints
    return doc
