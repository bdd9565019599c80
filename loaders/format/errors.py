"""The reader's error type, in a module of its own so that every layer (files, codecs, the format)
can raise it without importing the format module."""

from __future__ import annotations


class FormatError(Exception):
    """A dataset or shard does not follow this contract (missing, corrupt, wrong version)."""
