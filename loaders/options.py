"""Option groups of :class:`~loaders.dataset.ShardDataset`: how windows are decoded
(:class:`Engine`) and how shards are checked (:class:`Integrity`). Torch-free.

Each field is also a keyword of ``ShardDataset`` (``decode_process=False`` is
``engine=Engine(decode_process=False)``), as it always was; a keyword left unset (None) takes the
group's value, and a keyword that contradicts a value set in the group is a TypeError. What decides
the batches (split, sample, batch size, seed, window, ranks) stays a plain keyword; a sample type's
options go to the sample type.
"""

from __future__ import annotations

import difflib
import inspect
import re
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


# ShardLoader's keywords (loaders/loader.py imports torch's DataLoader; this module stays
# torch-free): tests/test_first_use.py checks this list against its signature
LOADER_OPTIONS = (
    "num_workers",
    "pin_memory",
    "prefetch_factor",
    "device",
    "persistent_workers",
    "multiprocessing_context",
    "timeout",
    "device_prefetch",
    "device_finish",
    "worker_batches",
    "partitions",
    "ship_csr",
)


def explain_option_error(
    error: TypeError, sample_cls: type, sample: str, options: dict[str, Any], own: list[str]
) -> TypeError:
    """The TypeError a sample type raised for a keyword it does not take (``takes no option 'x'``,
    or Python's ``unexpected keyword argument 'x'``), said where it belongs: ``num_workers`` and
    the other DataLoader keywords are ShardLoader's; a near miss (``batchsize``) names the
    keyword meant, as manifest errors do. Any other TypeError is returned as it is."""
    found = re.search(r"(?:takes no option|unexpected keyword argument) '([^']+)'", str(error))
    if found is None or found.group(1) not in options:
        return error
    name = found.group(1)
    if name in LOADER_OPTIONS:
        return TypeError(
            f"ShardDataset(..., {name}=...): {name!r} is an option of ShardLoader, not of the "
            f"dataset: ShardLoader(ShardDataset(...), {name}={options[name]!r})"
        )
    takes = sorted(
        {
            p.name
            for klass in sample_cls.__mro__
            if "__init__" in vars(klass) and klass is not object
            for p in inspect.signature(vars(klass)["__init__"]).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        }
    )
    near = difflib.get_close_matches(name, [*own, *takes], n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return TypeError(
        f"ShardDataset(..., {name}=...): unknown option {name!r}{hint} (sample type {sample!r} "
        f"takes {', '.join(takes) or 'no options'}; ShardDataset's own: {', '.join(own)})"
    )
