"""Cell barcodes (a matrix file's obs index) as a compact ragged UTF-8 column.

Why ragged bytes: barcodes are unique, so categories would not shrink them; a Python str per cell
costs ~50 bytes of overhead, a fixed-width bytes array as much as the longest name per cell.
Offsets + one byte buffer cost the names' own bytes plus 8 per cell, and a shard's names are one
vectorised gather.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders import format as fmt
from pipeline.errors import SourceError
from pipeline.modalities.perturbation.h5vlen import read_vlen_strings

if TYPE_CHECKING:
    import h5py  # import weight: the plan imports this module


@dataclass(frozen=True)
class ObsNames:
    offsets: np.ndarray  # int64 [n + 1]
    data: np.ndarray  # uint8 [total]: UTF-8 names back to back

    @staticmethod
    def from_values(values: Any) -> ObsNames:
        vals = np.asarray(values, dtype=object).ravel()
        raw: Any = vals
        if not set(map(type, vals)) <= {
            bytes,
            np.bytes_,
        }:  # h5py's strings are bytes: no Python step per name
            raw = [
                v if isinstance(v, bytes) else str(v).encode() for v in vals
            ]  # str, numbers: encoded
        joined = b"".join(raw)
        offsets = np.zeros(len(raw) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, raw), np.int64, len(raw)), out=offsets[1:])
        return ObsNames(offsets, np.frombuffer(joined, np.uint8).copy())

    @staticmethod
    def default(n: int) -> ObsNames:
        """anndata's default index for a file without one: "0", "1", ... (the row number)."""
        return ObsNames.from_values(np.arange(n).astype(str))

    def __len__(self) -> int:
        return int(self.offsets.size) - 1

    @cached_property
    def width(self) -> int:
        """The length every name has (barcodes often share one), else -1."""
        lengths = np.diff(self.offsets)
        return int(lengths[0]) if lengths.size and (lengths == lengths[0]).all() else -1

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, data) of ``rows``, in that order: the ragged field of a shard. Names of one
        width are gathered as items of that many bytes (no per-byte index)."""
        if self.width > 0:
            picked = np.take(self.data.view(f"V{self.width}"), rows).view(np.uint8)
            return np.arange(rows.size + 1, dtype=np.int64) * self.width, picked
        starts, lengths = self.offsets[rows], np.diff(self.offsets)[rows]
        out = np.zeros(rows.size + 1, np.int64)
        np.cumsum(lengths, out=out[1:])
        gather = np.repeat(starts - out[:-1], lengths) + np.arange(int(out[-1]), dtype=np.int64)
        return out, self.data[gather]


CHUNK = 1 << 16  # names read per step: a Python object per name lives only for one chunk (~4 MB)


def concat(parts: list[ObsNames]) -> ObsNames:
    if not parts:
        return ObsNames(np.zeros(1, np.int64), np.zeros(0, np.uint8))
    shifts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
    offsets = np.concatenate(
        [np.zeros(1, np.int64), *(p.offsets[1:] + k for p, k in zip(parts, shifts, strict=True))]
    )
    return ObsNames(offsets, np.concatenate([p.data for p in parts]))


def _obs_index(obs: h5py.Group | h5py.Dataset | None) -> tuple[Any, int, Any] | None:
    """(read(start, stop) -> those rows' names, number of names, the index dataset or None) of
    the obs index of an h5ad / H5-CSR file: ``obs/<obs.attrs['_index']>`` (modern and 0.7
    anndata, cell-load), the first field of a pre-0.7 compound obs table; None when there is
    none."""
    import h5py  # import weight: the plan imports this module

    if isinstance(obs, h5py.Dataset) and obs.dtype.names:
        first = obs.dtype.names[0]
        return (lambda a, b: obs.fields(first)[a:b]), obs.shape[0], None
    if isinstance(obs, h5py.Group):
        node = obs.get(attr_str(obs.attrs.get("_index", "_index")))
        if isinstance(node, h5py.Dataset) and node.ndim == 1:
            return (lambda a, b: node[a:b]), node.shape[0], node
    return None


def read_obs_names(
    obs: h5py.Group | h5py.Dataset | None, n_rows: int, path: str | Path
) -> ObsNames:
    """The obs index of an h5ad / H5-CSR file (`_obs_index`); the row numbers when there is none."""
    index = _obs_index(obs)
    if index is None:
        return ObsNames.default(n_rows)
    read, total, node = index
    # vlen strings straight from the file's bytes (h5vlen: no Python object per name), else h5py
    raw = None if node is None else read_vlen_strings(node)
    names = (
        ObsNames(*raw)
        if raw is not None
        else concat(
            [ObsNames.from_values(read(a, min(a + CHUNK, total))) for a in range(0, total, CHUNK)]
        )
    )
    if len(names) != n_rows:
        raise SourceError(path, f"obs index has {len(names)} names, the matrix has {n_rows} rows")
    return names


def check_obs_names(obs: h5py.Group | h5py.Dataset | None, n_rows: int, path: str | Path) -> None:
    """What `read_obs_names` checks, without reading the names: one per row (the scan's check; the
    plan reads each source's names when it plans that source)."""
    index = _obs_index(obs)
    if index is not None and index[1] != n_rows:
        raise SourceError(path, f"obs index has {index[1]} names, the matrix has {n_rows} rows")


def obs_name_columns(names: ObsNames | None, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The ``obs_names`` field of a shard whose records are ``rows`` of a source with these
    ``names``; {} when its source type reads no names (a plug-in's matrix source)."""
    if names is None:
        return {}
    offsets, data = names.take(rows)
    off_key, val_key = fmt.ragged_keys(fmt.OBS_NAMES)
    return {off_key: offsets, val_key: data}


def attr_str(value: Any) -> str:
    """HDF5 string attributes come back as str or bytes depending on who wrote them."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray) and value.shape == ():
        return attr_str(value[()])
    return str(value)
