"""Datasets in object storage (s3://, and S3-compatible servers): docs/REMOTE.md.

`store` is the one module that talks to a storage service (boto3, the ``remote`` extra); the rest
of shardsmith sees `ObjectStore` and its keys, which are the dataset folder's relative paths.
"""

from __future__ import annotations

from loaders.remote.store import (
    ObjectInfo,
    ObjectStore,
    RemoteError,
    RemoteNotFound,
    RetryPolicy,
    is_url,
    local_path,
    open_store,
)

__all__ = [
    "ObjectInfo",
    "ObjectStore",
    "RemoteError",
    "RemoteNotFound",
    "RetryPolicy",
    "is_url",
    "local_path",
    "open_store",
]
