"""The remote layer's errors and retry bounds: shared by the client (`loaders.remote.s3`) and the
store that uses it (`loaders.remote.store`), so that neither imports the other's internals."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from loaders.format.errors import FormatError

INSTALL = "pip install 'shardsmith[remote]'"
RETRY_ENV = "SHARDSMITH_REMOTE_RETRY"  # e.g. "attempts=2,total_s=5": a job's bound without code


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one request tries: ``attempts`` in all (1 = no retry; 0, the default: as many as
    ``total_s`` allows), backoff from ``base_s`` doubling up to ``max_s`` with jitter,
    ``timeout_s`` per request, ``connect_timeout_s`` per connection, and ``total_s`` for all
    attempts of one operation together: an unreachable endpoint fails within it instead of
    hanging.

    Why the time, not a count, bounds retries by default: a server restart or a load balancer
    failing over refuses connections for tens of seconds, and refused connections fail at once,
    so 5 attempts were spent in 3 s (issue 45, item 9). Retrying until ``total_s`` (120 s)
    survives a 30 s outage; the first error of an operation comes within :meth:`bound_s`."""

    attempts: int = 0
    base_s: float = 0.2
    max_s: float = 5.0
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    total_s: float = 120.0

    def bound_s(self) -> float:
        """The longest one operation takes before its error: retries stop at ``total_s``, and the
        attempt begun last may wait its connection and read timeouts out."""
        return self.total_s + self.connect_timeout_s + self.timeout_s

    def more(self, attempt: int) -> bool:
        """Whether the count allows another attempt after ``attempt`` (0: no count)."""
        return self.attempts <= 0 or attempt < self.attempts

    @classmethod
    def parse(cls, text: str, base: RetryPolicy | None = None) -> RetryPolicy:
        """``"attempts=2,total_s=5"`` over ``base`` (the ``SHARDSMITH_REMOTE_RETRY`` spelling)."""
        known = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, _, value = item.partition("=")
            if name.strip() not in known:
                raise ValueError(
                    f"{RETRY_ENV}: unknown setting {name.strip()!r} (known: {', '.join(known)})"
                )
            cast = int if name.strip() == "attempts" else float
            values[name.strip()] = cast(value)
        return replace(base or cls(), **values)

    @classmethod
    def from_env(cls) -> RetryPolicy:
        return cls.parse(os.environ.get(RETRY_ENV, ""))


class RemoteError(FormatError):
    """A request to object storage failed for good: ``url`` (the object or prefix), ``problem``,
    ``fix``. A FormatError, so every command reports it as bad input (exit 2)."""

    def __init__(self, url: str, problem: str, fix: str = "") -> None:
        self.url, self.problem, self.fix = url, problem, fix
        super().__init__(f"{url}: {problem}" + (f"; {fix}" if fix else ""))

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return (type(self), (self.url, self.problem, self.fix))


class RemoteNotFound(RemoteError):
    """The object (or bucket) does not exist."""
