"""One dataset file (a shard, the condition table) from object storage into a local temporary path:
one object, or every object of a zarr folder at its relative path.

Why a module of its own: the node cache (shards) and the URL opener (the files beside index.json)
download the same way and check the same thing, that a listed object's name cannot leave the
temporary folder it is written into (a listing is the server's word, as index.json is).
"""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from loaders.format.names import relative_name
from loaders.remote.store import ObjectStore, RemoteError, RemoteNotFound


def download_tree(
    store: ObjectStore,
    key: str,
    tmp: Path,
    folder: bool,
    named_by: str,
    pool: Executor | None = None,
) -> int:
    """``key`` into ``tmp``: one object, or with ``folder`` every object below ``key/`` (a zarr
    store) at its relative path, on ``pool`` when given; its bytes. The one download of a dataset
    file for the shards and the files beside index.json; the caller checks and renames."""
    if not folder:
        return store.get_to_file(key, tmp)
    objects = [o for o in store.list(key + "/") if o.key.startswith(key + "/")]
    if not objects:
        raise RemoteNotFound(
            store.key_url(key + "/"), "has no objects", f"push the dataset again ({named_by})"
        )
    for o in objects:  # a listing is the server's word: each key stays below ``tmp``
        if not relative_name(o.key[len(key) + 1 :]):
            raise RemoteError(
                store.key_url(o.key),
                f"is no object of the dataset file {key} (its name leaves the folder)",
                f"remove that object from the bucket, or push the dataset again ({named_by})",
            )
        (tmp / o.key[len(key) + 1 :]).parent.mkdir(parents=True, exist_ok=True)

    def get(o: Any) -> int:
        return store.get_to_file(o.key, tmp / o.key[len(key) + 1 :])

    return sum(pool.map(get, objects) if pool is not None else map(get, objects))
