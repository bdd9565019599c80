"""What a report is made of: sections of figures, each figure its data (what FILE.json holds), an
optional inline SVG plot and an optional table; a figure the dataset cannot show says why.

A section function gets a :class:`ReportContext`: the dataset's index, the ``inspect`` summary
(:func:`pipeline.verify.summary`, the numbers ``inspect --json`` prints) and a reader of shard
columns, so that a figure never recomputes what the summary already holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loaders import format as fmt
from loaders.format.readers import read_shard


class Unavailable(Exception):
    """A figure this dataset cannot show: the message says what its index does not record (an
    index written by an older shardsmith) or which column it lacks."""


@dataclass
class Table:
    """Rows of cells under a header; ``flagged`` rows are highlighted (e.g. below sentence_size)."""

    columns: list[str]
    rows: list[list[Any]]
    flagged: list[int] = field(default_factory=list)  # row positions
    shade: bool = False  # a heatmap: numeric cells shaded by value (cells per split x cell type)

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.columns, "rows": self.rows}


@dataclass
class Figure:
    """One figure: ``key`` names its data in FILE.json; ``svg`` an inline plot; ``missing`` the
    reason it is not shown (then it has neither data nor plot)."""

    key: str
    title: str
    data: Any = None
    svg: str | None = None
    table: Table | None = None
    note: str = ""
    missing: str | None = None
    open_table: bool = True  # False: the table sits in a closed <details> (a long one)


@dataclass
class Section:
    title: str
    figures: list[Figure]
    intro: str = ""


class ReportContext:
    """The dataset a section describes: ``index``, ``summary`` (as ``inspect --json``) and
    :meth:`columns`, the shard columns a figure needs, read once per key set."""

    def __init__(self, index: fmt.Index, summary: Mapping[str, Any]) -> None:
        self.index = index
        self.summary = summary
        self._cache: dict[tuple[str, ...], list[tuple[fmt.ShardEntry, dict[str, np.ndarray]]]] = {}

    @property
    def details(self) -> Mapping[str, Any]:
        """The kind's part of the summary (``inspect``'s details)."""
        return self.summary.get("details") or {}

    def need(self, mapping: Mapping[str, Any], key: str, what: str) -> Any:
        """``mapping[key]``, or :class:`Unavailable` saying the index does not record ``what``."""
        value = mapping.get(key) if isinstance(mapping, Mapping) else None
        if value is None:
            raise self.unrecorded(what)
        return value

    def unrecorded(self, what: str) -> Unavailable:
        """The reason a figure is missing when the index does not record ``what``."""
        return Unavailable(
            f"this dataset's index (version {self.index.raw.get('version')}) does not record "
            f"{what}: rebuild it with this shardsmith to see it"
        )

    def columns(self, keys: list[str]) -> list[tuple[fmt.ShardEntry, dict[str, np.ndarray]]]:
        """Each shard's entry and ``keys`` of its columns, in index order; a key the dataset's
        fields do not declare is :class:`Unavailable`."""
        declared = {k for f in self.index.fields for k in f.keys()}
        absent = [k for k in keys if k not in declared and k not in self.index.tables]
        if absent:
            raise Unavailable(f"this dataset stores no {', '.join(absent)}")
        want = tuple(keys)
        if want not in self._cache:
            self._cache[want] = [
                (e, read_shard(self.index.shard_path(e), self.index.encoding, keys))
                for e in self.index.shards
            ]
        return self._cache[want]


SectionFn = Callable[[ReportContext], Section]


def figure(key: str, title: str, build: Callable[[], Figure]) -> Figure:
    """``build()``, or a figure that says why it cannot be shown (never a traceback)."""
    try:
        return build()
    except Unavailable as e:
        return Figure(key=key, title=title, missing=str(e))


def splits_in_order(names: Iterator[str] | list[str]) -> list[str]:
    """Split names in train, val, test order, then any other."""
    names = list(dict.fromkeys(names))
    return [s for s in fmt.SPLITS if s in names] + sorted(s for s in names if s not in fmt.SPLITS)
