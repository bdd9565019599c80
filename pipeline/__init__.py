"""Offline conversion of scientific sources into packed, planned, verified shards."""

from __future__ import annotations

__version__ = "0.1.0"
