"""Thin streaming reader of shardsmith shards for PyTorch trainers."""

from __future__ import annotations
