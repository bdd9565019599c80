"""Streaming reader of shardsmith shards for PyTorch trainers: this top level is the public face;
below it the on-disk contract (``format``), the epoch order (``epoch``), the sample-type API
(``samples``) and the decode engine (``engine``), which decodes each shuffle window once per rank.

`ShardDataset` and `ShardLoader` are imported on first use (PEP 562), so that the pipeline, which
needs only `loaders.format` and `loaders.format.readers`, never pays for importing torch (~300 MiB and
~1 s per process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loaders.dataset import ShardDataset
    from loaders.loader import ShardLoader

__all__ = ["ShardDataset", "ShardLoader"]


def __getattr__(name: str) -> Any:
    if name == "ShardDataset":
        # import weight: torch, only when asked for (PEP 562)
        from loaders.dataset import ShardDataset

        return ShardDataset
    if name == "ShardLoader":
        # import weight: torch, only when asked for (PEP 562)
        from loaders.loader import ShardLoader

        return ShardLoader
    raise AttributeError(f"module 'loaders' has no attribute {name!r}")
