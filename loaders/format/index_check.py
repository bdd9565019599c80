"""What a reader and ``verify`` do with index.json's digest: compare the index's own content with
the digest its build stored, then refuse (a ``ShardDataset`` at open), warn (an index older than
digests) or report (``shardsmith verify``).

Why a module of its own: the digest itself (which keys it covers, how each is hashed) is part of
the on-disk contract and stays in ``loaders.format``, which writes it; deciding what an index that
does not match it means, and what to tell the user, is the readers' policy, applied on top of a
parsed :class:`~loaders.format.Index`.
"""

from __future__ import annotations

import warnings

from loaders.format import (
    DIGEST_KEYS,
    FIRST_DIGEST_KEYS,
    FULL_DIGEST_INDEX_VERSION,
    SEALED_INDEX_VERSION,
    Index,
    index_digest,
    index_path,
)
from loaders.format.errors import FormatError


def digest_mismatch(index: Index) -> list[str] | None:
    """The DIGEST_KEYS whose content in index.json differs from the digest stored at build ([]:
    none), or None when the index stores no digest. Version 1 predates digests: [] (nothing to
    check). A key of the first digest missing from a stored digest counts as differing (an edit);
    a later key is checked where the digest has it (an index built before it was added), except
    from version 5, whose digest must hold every key (``plugins`` among them)."""
    version = index.raw.get("version")
    if version == 1:
        return []
    stored = index.raw.get("digest")
    if not isinstance(stored, dict):
        return None
    now = index_digest(index.raw)
    required = (
        DIGEST_KEYS
        if isinstance(version, int) and version >= FULL_DIGEST_INDEX_VERSION
        else FIRST_DIGEST_KEYS
    )
    return [
        key
        for key in DIGEST_KEYS
        if (key in stored or key in required) and stored.get(key) != now[key]
    ]


def digest_problems(index: Index) -> list[str]:
    """``verify``'s messages for :func:`digest_mismatch`: one per differing key, naming index.json;
    one when there is no digest at all."""
    path = index_path(index.root)
    keys = digest_mismatch(index)
    if keys is None:
        return [
            f"{path}: no content digest (edited, or written by an older shardsmith): "
            "rebuild the dataset"
        ]
    return [
        f"{path}: {key!r} differs from the digest stored at build (edited after the build?)"
        for key in keys
    ]


def check_index_digest(index: Index) -> None:
    """Refuse, at open, an index whose own content does not match its digest: a shard entry removed
    serves part of a split, swapped vocabulary labels serve codes under the wrong names, and no
    shard's hash shows either. Costs one sha256 over the index's JSON (a few ms: measured in
    docs/LOADER.md), so a reader checks what ``verify`` checks about the index itself. An index
    with no digest at all is read with a RuntimeWarning when it is of version 1-3 (a shardsmith
    before the digest wrote none, and refusing would strand its datasets; ``verify`` reports it);
    from version 4 on every build wrote one, so an index without it was stripped of it (the way
    to edit an index without sealing it again) and is refused."""
    path = index_path(index.root)
    keys = digest_mismatch(index)
    version = index.raw.get("version")
    if keys is None and isinstance(version, int) and version >= SEALED_INDEX_VERSION:
        raise FormatError(
            f"{path}: index version {version} without its content digest ('digest'): every "
            "shardsmith that writes this version writes one, so the index was edited and its "
            "digest removed; rebuild the dataset (or push it again from the folder it was built "
            "in)"
        )
    if keys is None:
        warnings.warn(
            f"{path}: no content digest (edited, or written by an older shardsmith): its shard "
            "list, counts and vocabularies are read unchecked; rebuild the dataset to add one",
            RuntimeWarning,
            stacklevel=3,
        )
    elif keys:
        raise FormatError(
            f"{path}: {', '.join(map(repr, keys))} differ(s) from the digest stored at build: "
            "index.json was edited after the build (a shard entry removed, labels changed...), "
            "so its data would be served wrong; rebuild the dataset, or run "
            f"`shardsmith verify {index.root}` to list what differs"
        )
