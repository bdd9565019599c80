"""Errors that name the file (or manifest key) and the problem, so a nightly log says what to fix;
and the exit codes every `shardsmith` command shares (a nightly job branches on them)."""

from __future__ import annotations

from pathlib import Path

# Exit codes of every `shardsmith` command, for schedulers (cron, Airflow, Slurm) that act on them:
EXIT_OK = (
    0  # success, whether or not anything changed (a build's summary says "changed": true/false)
)
EXIT_CRASH = (
    1  # an unexpected failure (a bug): the traceback is printed; `verify` also exits 1 on problems;
)
#                 also a build that the environment stopped (the disk is full: OutputError)
EXIT_BAD_INPUT = (
    2  # the manifest, a source or a dataset is wrong: the message names the file/key and the fix
)
EXIT_LOCKED = 3  # another build holds the output folder's lock: retry later


class ShardsmithError(Exception):
    """Base class: every user-facing failure of the pipeline. ``exit_code``: what the CLI exits
    with."""

    exit_code = EXIT_BAD_INPUT


class ManifestError(ShardsmithError):
    def __init__(self, manifest: str | Path, key: str, problem: str) -> None:
        self.manifest, self.key, self.problem = str(manifest), key, problem
        # a problem of the whole file (unreadable, not TOML) has no key to name: no "[-]"
        where = f"[{key}] " if key not in ("", "-") else ""
        super().__init__(f"{manifest}: {where}{problem}")

    def __reduce__(
        self,
    ) -> tuple[type, tuple[str, str, str]]:  # survives joblib's trip between processes
        return (type(self), (self.manifest, self.key, self.problem))


class SourceError(ShardsmithError):
    def __init__(self, path: str | Path, problem: str) -> None:
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.path, self.problem))


class DatasetError(ShardsmithError):
    """A shard dataset on disk is missing, corrupt or inconsistent."""


class NothingKeptError(ShardsmithError):
    """A build whose records were all skipped, or that found none: committing it would replace a
    good dataset with an empty one and report success, so it is bad input and nothing is
    committed (the files it wrote go at once)."""


class LockHeldError(ShardsmithError):
    """Another process holds the exclusive lock on an output folder (one writer per --out)."""

    exit_code = EXIT_LOCKED


class OutputError(ShardsmithError):
    """The output folder cannot be used: it holds files that are not ours (bad input), or writing to
    it failed (disk full: EXIT_CRASH; read-only: bad input). Nothing was committed: the previous
    dataset is intact."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type, tuple[str, int]]:
        return (type(self), (str(self), self.exit_code))
