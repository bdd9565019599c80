"""Errors that name the file (or manifest key) and the problem, so a nightly log says what to fix."""

from __future__ import annotations

from pathlib import Path


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
