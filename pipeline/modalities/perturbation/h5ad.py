"""scPerturb-style `.h5ad` files, in anndata's modern encoding and in the pre-0.7 layout of archived
screens.

Rows come through the shared h5py block reader (anndata's backed mode reads a row block no faster
and holds more state). Metadata in the encodings anndata writes for nearly every column
(categorical, string-array, array) is read with h5py too (:func:`is_plain`: importing anndata
costs more than an incremental rebuild's scan); the other spellings of a column (nullable arrays,
anndata 0.7 frames) go through anndata's own element readers. `anndata.io.read_elem` does not
understand pre-0.7 files: the obs table is a compound dataset that it returns as a raw structured
array, and the categories live in `uns/<col>_categories` where only `read_h5ad` reattaches them.
Reading the requested fields of that table directly is both simpler and cheaper than loading the
whole object in backed mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from pipeline.lazy import LazyModule
from pipeline.modalities.perturbation.h5columns import (
    categorical_from_codes,
    decode_strings,
    read_plain_column,
    to_categorical,
)
from pipeline.modalities.perturbation.h5source import H5Source
from pipeline.modalities.perturbation.matrix import Categorical
from pipeline.modalities.perturbation.obs_names import attr_str
from pipeline.source import register_source

if TYPE_CHECKING:
    import h5py
else:  # imported on first use (pipeline.lazy: declaring a source costs no heavy import)
    h5py = LazyModule("h5py")


def read_elem(elem: object) -> object:
    """anndata's element reader, imported on first use: anndata (with pandas and dask.array) costs
    ~0.5 s to import, which a no-change rebuild should not pay (and see :func:`is_plain`)."""
    from anndata.io import read_elem as _read_elem  # import weight: ~0.6 s, only for rare encodings

    return _read_elem(elem)


def is_plain(node: h5py.Group | h5py.Dataset) -> bool:
    """Whether ``node`` is in an encoding anndata writes for nearly every scPerturb column and h5py
    reads as it is (then :func:`~pipeline.modalities.perturbation.h5columns.read_plain_column`,
    the hand-written files' reader, reads it): a ``string-array`` or ``array`` dataset, or a
    ``categorical`` group of two datasets (codes, categories). Not for anything else (nullable
    arrays, nested encodings), which goes through :func:`read_elem`.

    Why: importing anndata for these costs more than a changed source's whole scan in an
    incremental build (~0.5 s of a 1.4 s rebuild), and both readers give the same codes and
    categories (tested)."""
    encoding = attr_str(node.attrs.get("encoding-type", ""))
    if isinstance(node, h5py.Dataset):
        return encoding in ("string-array", "array")
    if encoding != "categorical" or set(node) != {"codes", "categories"}:
        return False
    codes, categories = node["codes"], node["categories"]
    return (
        isinstance(codes, h5py.Dataset)
        and isinstance(categories, h5py.Dataset)
        and attr_str(categories.attrs.get("encoding-type", "")) in ("", "string-array", "array")
    )


@register_source
class H5adSource(H5Source):
    type: ClassVar[str] = "h5ad"
    suffixes: ClassVar[tuple[str, ...]] = (".h5ad",)

    def _var_names(self, var_path: str) -> tuple[str, ...] | None:
        var = self._node(var_path)
        if isinstance(
            var, h5py.Dataset
        ):  # pre-0.7: a compound table whose first field is the index
            if not var.dtype.names:
                return None
            return tuple(decode_strings(var.fields(var.dtype.names[0])[()]))
        if not isinstance(var, h5py.Group):
            return None
        index = attr_str(var.attrs.get("_index", "_index"))
        if index not in var:
            return None
        node = var[index]
        plain = "encoding-type" not in node.attrs or (
            isinstance(node, h5py.Dataset) and is_plain(node)
        )
        return tuple(decode_strings(np.asarray(node[()] if plain else read_elem(node))))

    def _obs_columns(self) -> list[str]:
        obs = self._node("obs")
        if isinstance(obs, h5py.Dataset):
            return list(obs.dtype.names[1:]) if obs.dtype.names else []
        if not isinstance(obs, h5py.Group):
            return []
        if "column-order" in obs.attrs:
            return [attr_str(c) for c in np.atleast_1d(obs.attrs["column-order"])]
        index = attr_str(obs.attrs.get("_index", "_index"))
        return [k for k in obs if k not in (index, "_index", "__categories")]

    def _read_obs(self, columns: Sequence[str]) -> dict[str, Categorical]:
        if not columns:
            return {}
        obs = self._node("obs")
        if isinstance(obs, h5py.Dataset):
            return {c: self._legacy_column(obs, c) for c in columns}
        assert isinstance(obs, h5py.Group)  # _obs_columns found the columns there
        encoding = attr_str(obs.attrs.get("encoding-type", ""))
        version = attr_str(obs.attrs.get("encoding-version", ""))
        if encoding == "dataframe" and version == "0.1.0":
            # anndata 0.7: codes datasets point at obs/__categories by reference; let anndata
            # resolve the whole frame
            frame = read_elem(obs)
            return {c: to_categorical(frame[c]) for c in columns}
        if encoding == "dataframe":
            return {c: self._modern_column(obs[c], c) for c in columns}
        return {c: read_plain_column(obs[c], self.path, c) for c in columns}

    def _modern_column(self, node: h5py.Group | h5py.Dataset, column: str) -> Categorical:
        if "encoding-type" not in node.attrs or is_plain(node):
            return read_plain_column(node, self.path, column)
        # nullable-* and other encodings come back from anndata as something pandas can factorize;
        # anndata's Categorical.from_codes also rejects out-of-range codes (-> SourceError via
        # _reading)
        return to_categorical(read_elem(node))

    def _legacy_column(self, table: h5py.Dataset, column: str) -> Categorical:
        values = table.fields(column)[()]
        categories = self._legacy_categories(column)
        if categories is not None and values.dtype.kind in "iu":
            return categorical_from_codes(values, categories, self.path, column)
        return to_categorical(values)

    def _legacy_categories(self, column: str) -> np.ndarray | None:
        # anndata 0.6 kept categories in uns/; earlier releases wrote them at the top level of the
        # file
        for name in (f"uns/{column}_categories", f"{column}_categories"):
            node = self._node(name)
            if isinstance(node, h5py.Dataset):
                return np.atleast_1d(node[()])  # a single category was written as a scalar
        return None
