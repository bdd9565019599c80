"""What scanpy and PyTorch users ask of a dataset besides batches: the matrix's column names
(genes), the splits, the condition table, and the names of the records a batch came from (a
single-cell dataset's cell barcodes: the field its sample types name as ``record_names``).

Why a module of its own: these read ``index.json`` and, for barcodes, one field of the shards;
the training path (:mod:`loaders.dataset`) never reads them, so a dataset costs nothing for them
until they are asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loaders import format as fmt
from loaders.format.readers import read_shard
from loaders.samples import SAMPLE_TYPES


def var_names(index: fmt.Index) -> list[str]:
    """The matrix's column names (genes) in column order; [] for a kind without a gene matrix."""
    return [str(v) for v in index.section().get("var_names", [])]


def splits(index: fmt.Index) -> list[str]:
    """The splits that hold shards, in the format's order (train, val, test), then any other,
    sorted."""
    present = {s.split for s in index.shards}
    return [s for s in fmt.SPLITS if s in present] + sorted(present - set(fmt.SPLITS))


def condition_dim(index: fmt.Index) -> int:
    """Width of the condition vectors (``batch["cond"]``): 0 when the dataset has no condition
    table."""
    return 0 if index.conditions is None else int(index.conditions.dim)


def decode_names(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A ragged UTF-8 field of a shard (e.g. the record names) as an object array of str."""
    raw = values.tobytes()
    return np.array(
        [
            raw[a:b].decode()
            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
        ],
        dtype=object,
    )


def names_field(index: fmt.Index) -> str | None:
    """The field holding record names: the ``record_names`` of the index's sample types (None:
    none)."""

    for name in index.samples:
        cls = SAMPLE_TYPES.get(name, None)  # type: ignore[arg-type]
        field = getattr(cls, "record_names", None)
        if field:
            return str(field)
    return None


def shard_obs_names(
    index: fmt.Index, entry: fmt.ShardEntry, field: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(sample_id, name) of every record of one shard (``field``: the names' field, by default the
    sample types' ``record_names``)."""
    field = field or names_field(index)
    if field is None:
        raise fmt.FormatError(f"{index.root}: its sample types name no field of record names")
    off, val = fmt.ragged_keys(field)
    cols = read_shard(index.shard_path(entry), index.encoding, [fmt.SAMPLE_ID, off, val])
    return cols[fmt.SAMPLE_ID], decode_names(cols[off], cols[val])


def obs_names_for(
    root: str | Path | fmt.Index,
    sample_ids: Iterable[int] | np.ndarray,
    split: str | Sequence[str] | None = None,
    field: str | None = None,
) -> np.ndarray:
    """The name of each sample id's record (a cell's barcode: its source's ``obs_names``), in the
    order given.

    Reads the names field (``field``, by default the one the index's sample types name as
    ``record_names``) of the shards of ``split`` (all splits when None); an id that is in none of
    them is a KeyError naming it. Datasets built before the field existed say how to get it
    (rebuild)."""
    index = root if isinstance(root, fmt.Index) else fmt.read_index(root)
    field = field or names_field(index)
    if field is None or not index.has_field(field):
        raise fmt.FormatError(
            f"{index.root}: this dataset stores no record names (built before "
            "they were stored, or a kind without them): rebuild it with "
            f"`shardsmith build MANIFEST --out {index.root}`"
        )
    wanted = np.asarray(
        list(sample_ids) if not isinstance(sample_ids, np.ndarray) else sample_ids, np.int64
    )
    keep = [split] if isinstance(split, str) else None if split is None else list(split)
    ids, names = [], []
    for entry in index.shards:
        if keep is None or entry.split in keep:
            i, n = shard_obs_names(index, entry, field)
            ids.append(i)
            names.append(n)
    all_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    all_names = np.concatenate(names) if names else np.zeros(0, object)
    order = np.argsort(
        all_ids, kind="stable"
    )  # duplicated controls repeat an id with the same name
    pos = np.searchsorted(all_ids[order], wanted)
    found = (pos < all_ids.size) & (
        all_ids[order][np.minimum(pos, max(all_ids.size - 1, 0))] == wanted
    )
    if not found.all():
        raise KeyError(
            f"sample_id {int(wanted[~found][0])} is not in {index.root}"
            + (f" (split {split})" if split is not None else "")
        )
    return all_names[order][pos]


class DatasetInfo:
    """What a `ShardDataset` holds, for users and tools (a mixin: it needs ``root``, ``split`` and
    ``sample_type``): read from index.json on demand, never on the training path."""

    root: Path
    split: str
    sample_type: Any

    @property
    def var_names(self) -> list[str]:
        """Gene names, in the column order of ``batch["X"]`` ([] for a kind without a gene matrix)."""
        return var_names(fmt.read_index(self.root))

    @property
    def splits(self) -> list[str]:
        """The splits of the dataset (each a valid ``split=``)."""
        return splits(fmt.read_index(self.root))

    @property
    def condition_dim(self) -> int:
        """Width of ``batch["cond"]`` (0 without a condition table): to size a model's condition
        input."""
        return condition_dim(fmt.read_index(self.root))

    @property
    def vectors(self) -> np.ndarray | None:
        """The condition table, float32 [conditions, condition_dim] (``batch["cond"]`` is its rows
        at ``batch["cond_id"]``); None when the dataset has none. A property, loaded once per
        process."""
        get = getattr(self.sample_type, "vectors", None)
        return get() if get is not None else None

    def obs_names_for(self, sample_ids: Any) -> np.ndarray:
        """Record names (cell barcodes: the sources' ``obs_names``) of ``batch["sample_id"]``, in
        that order, from this split's shards (the field the sample type names as
        ``record_names``)."""
        ids = sample_ids.numpy() if hasattr(sample_ids, "numpy") else sample_ids  # tensor or array
        field = getattr(self.sample_type, "record_names", None)
        return obs_names_for(self.root, ids, self.split, field)
