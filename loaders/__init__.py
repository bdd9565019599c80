"""Thin streaming reader of shardsmith shards for PyTorch trainers."""

from __future__ import annotations

from loaders.dataset import ShardDataset
from loaders.loader import ShardLoader

__all__ = ["ShardDataset", "ShardLoader"]
