"""Option groups of :class:`~loaders.dataset.ShardDataset`: how windows are decoded
(:class:`Engine`) and how shards are checked (:class:`Integrity`). Torch-free.

Each field is also a keyword of ``ShardDataset`` (``decode_process=False`` is
``engine=Engine(decode_process=False)``), as it always was; a keyword left unset (None) takes the
group's value, and a keyword that contradicts a value set in the group is a TypeError. What decides
the batches (split, sample, batch size, seed, window, ranks) stays a plain keyword; a sample type's
options go to the sample type.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

G = TypeVar("G")


@dataclass(frozen=True)
class Engine:
    """How a rank's windows are decoded and batches assembled (:mod:`loaders.engine`).

    ``decode_process``: decode in a torch-free process per rank (default: where the platform has
    one); ``decode_ahead``: request the next window (and at an epoch's end the next epoch's first)
    while serving; ``decode_threads``: threads decoding one window's shards (default
    ``min(window, cores, 4)`` in-process, 1 in the decoder process); ``batches_ahead``: batches
    assembled ahead in a thread (default 2 with 4 or more cores, else 0); ``decode_timeout``:
    seconds the decoder process may stay silent before it is killed and decoding moves into the
    training process (a shorter ``ShardLoader(timeout=...)`` lowers it)."""

    decode_process: bool | None = None
    decode_ahead: bool = True
    decode_threads: int | None = None
    batches_ahead: int | None = None
    decode_timeout: float = 30.0


@dataclass(frozen=True)
class Integrity:
    """How shards are checked before they are served (:mod:`loaders.format.integrity`).

    ``verify``: ``True`` hashes each shard once per process and again whenever a file of it
    changes, ``"always"`` every read, ``False`` only counts zarr chunks; ``on_corrupt``:
    ``"raise"`` (naming the shard) or ``"skip"`` (its units are left out and listed in
    ``ShardDataset.skipped_shards``)."""

    verify: bool | str = True
    on_corrupt: str = "raise"


def resolve(group: G | None, cls: type[G], **given: Any) -> G:
    """``group`` (or the defaults of ``cls``) with the keywords in ``given`` that are not None
    applied; a keyword contradicting a field the group sets (not at its default) is a TypeError."""
    base = cls() if group is None else group
    if not isinstance(base, cls):
        raise TypeError(f"expected a {cls.__name__}, got {type(base).__name__}")
    defaults = {f.name: f.default for f in fields(cls)}  # type: ignore[arg-type]
    kept = {k: v for k, v in given.items() if v is not None}
    for k, v in kept.items():
        mine = getattr(base, k)
        if group is not None and mine != defaults[k] and mine != v:
            raise TypeError(f"{k}={v!r} contradicts {cls.__name__}({k}={mine!r}): give it once")
    return replace(base, **kept)  # type: ignore[type-var]
