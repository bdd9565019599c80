"""Task descriptors for remote backends (dask, ray): a task's arguments with every array replaced by
a reference to a plain .npy file in the build's spill folder.

Why: the pack tasks are ``functools.partial`` objects over the plan's per-shard arrays (source
rows, planned columns, routed row ranges). Shipped as they are, each task would push megabytes
through the scheduler (and joblib's dask backend scatters every argument over 1 kB). Written once
to the spill folder, which lives in OUT on the filesystem every worker shares anyway, a task is a
few kB: a function, paths, row ranges and settings. Files are loaded with ``allow_pickle=False``;
nothing the build reads back is ever unpickled.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

INLINE_ARRAY_BYTES = (
    256  # arrays up to this size stay inline (a file would cost more than it saves)
)
Task = Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class ArrayRef:
    """An array a remote task loads from the spill folder (plain .npy, never pickled)."""

    path: str
    nbytes: int

    def load(self) -> np.ndarray:
        return np.load(self.path, allow_pickle=False)


@dataclasses.dataclass(frozen=True)
class Descriptor:
    """What a remote worker receives: a module-level function (or a registered kind's method) and
    its arguments, with arrays replaced by ArrayRefs."""

    func: Callable[..., Any]
    args: tuple[Any, ...]
    keywords: dict[str, Any]
    label: str = (
        ""  # what the task makes (its shards' file names), for task keys on a cluster's dashboard
    )

    def __call__(self) -> Any:
        return self.func(*_resolve(self.args), **_resolve(self.keywords))


def _walk(
    obj: Any, leaf: Callable[[Any], Any], seen: Callable[[Any], None] = lambda o: None
) -> Any:
    """`obj` with `leaf` applied to every value inside its tuples, lists, dicts and dataclass fields
    (copies where something changed; the original is never modified). `seen` is shown every
    dataclass met."""
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_walk(a, leaf, seen) for a in obj)
    if isinstance(obj, list):
        return [_walk(a, leaf, seen) for a in obj]
    if isinstance(obj, dict):
        return {k: _walk(v, leaf, seen) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, (type, ArrayRef, Descriptor)):
        seen(obj)
        new = copy.copy(obj)
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            replaced = _walk(value, leaf, seen)
            if replaced is not value:
                object.__setattr__(
                    new, f.name, replaced
                )  # frozen dataclasses too: `new` is our own copy
        return new
    return leaf(obj)


class _Spiller:
    """Replaces arrays in nested arguments by ArrayRefs, writing each distinct array once."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.saved: dict[int, ArrayRef] = {}
        self.keep: list[np.ndarray] = []  # ids stay valid while the arrays live
        self.counter = itertools.count()
        self.files: list[
            str
        ] = []  # the `file` of every dataclass met (ShardPlans): the task's label

    def describe(self, task: partial[Any]) -> Descriptor:
        self.files.clear()
        args = _walk(task.args, self._leaf, self._seen)
        keywords = _walk(task.keywords, self._leaf, self._seen)
        return Descriptor(task.func, args, keywords, "+".join(dict.fromkeys(self.files))[:200])

    def _seen(self, obj: Any) -> None:
        if isinstance(getattr(obj, "file", None), str):
            self.files.append(obj.file)

    def _leaf(self, obj: Any) -> Any:
        if (
            not isinstance(obj, np.ndarray)
            or obj.nbytes <= INLINE_ARRAY_BYTES
            or obj.dtype.hasobject
        ):
            return obj
        ref = self.saved.get(id(obj))
        if ref is None:
            path = self.folder / f"a{next(self.counter):07d}.npy"
            np.save(path, obj, allow_pickle=False)
            ref = self.saved[id(obj)] = ArrayRef(str(path), int(obj.nbytes))
            self.keep.append(obj)
        return ref


def _resolve(obj: Any) -> Any:
    return _walk(obj, lambda o: o.load() if isinstance(o, ArrayRef) else o)


def describe(tasks: Sequence[Task], folder: Path) -> list[Descriptor]:
    """Descriptors of tasks (functools.partial objects) for remote workers; arrays go to `folder`."""
    spill = _Spiller(folder)
    for t in tasks:
        if not isinstance(t, partial):
            raise TypeError(f"a remote task must be a functools.partial, got {type(t).__name__}")
    return [spill.describe(t) for t in tasks]  # type: ignore[arg-type]


def run_descriptor(d: Descriptor) -> Any:
    """The function remote workers run (module level: importable by name on the worker)."""
    return d()
