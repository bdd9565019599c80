"""Errors that name the file (or manifest key) and the problem, so a nightly log says what to fix."""

from __future__ import annotations

from pathlib import Path

# Exit codes of every `shardsmith` command, for schedulers (cron, Airflow, Slurm) that act on them:
EXIT_OK = 0  # success, whether or not anything changed (a build's summary says "changed": true/false)
EXIT_CRASH = 1  # an unexpected failure (a bug): the traceback is printed; `verify` also exits 1 on problems
EXIT_BAD_INPUT = 2  # the manifest, a source or a dataset is wrong: the message names the file/key and the fix
EXIT_LOCKED = 3  # another build holds the output folder's lock: retry later



class ShardsmithError(Exception):
    """Base class: every user-facing failure of the pipeline."""


class ManifestError(ShardsmithError):
    def __init__(self, manifest: str | Path, key: str, problem: str) -> None:
        self.manifest, self.key, self.problem = str(manifest), key, problem
        super().__init__(f"{manifest}: [{key}] {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:  # survives joblib's trip between processes
        return (type(self), (self.manifest, self.key, self.problem))


class SourceError(ShardsmithError):
    def __init__(self, path: str | Path, problem: str) -> None:
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (self.path, self.problem))


class DatasetError(ShardsmithError):
    """A shard dataset on disk is missing, corrupt or inconsistent."""
