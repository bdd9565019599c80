"""STATE / cell-load style HDF5 files (source type ``h5csr``): anndata-like layout written by hand,
so nothing can be assumed about attrs. Rows, obsm and structural checks are the shared
:class:`~pipeline.modalities.perturbation.h5source.H5Source`'s; this module says only where such
files keep their var names and obs columns, and the cell-load convention for a missing cell type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from pipeline.lazy import LazyModule
from pipeline.modalities.perturbation.h5columns import read_plain_column, read_plain_strings
from pipeline.modalities.perturbation.h5source import H5Source
from pipeline.modalities.perturbation.matrix import Categorical
from pipeline.modalities.perturbation.obs_names import attr_str
from pipeline.source import register_source

if TYPE_CHECKING:
    import h5py
else:  # imported on first use (pipeline.lazy: declaring a source costs no heavy import)
    h5py = LazyModule("h5py")

VAR_NAME_KEYS = (
    "_index",
    "gene_name",
    "gene_names",
    "gene_symbols",
    "feature_name",
    "gene_ids",
    "gene_id",
    "index",
)


@register_source
class H5CsrSource(H5Source):
    """STATE / cell-load style files: anndata-like layout written by hand, so nothing can be assumed
    about attrs."""

    type: ClassVar[str] = "h5csr"
    suffixes: ClassVar[tuple[str, ...]] = (".h5", ".hdf5")
    fillable_obs: ClassVar[tuple[str, ...]] = ("cell_type",)

    def fill_obs(self, logical: str, n_rows: int) -> Categorical | None:
        """cell-load convention: a file without a cell type column holds one cell line, named by its
        stem."""
        if logical == "cell_type":
            return Categorical(np.zeros(n_rows, np.int32), (self.path.stem,))
        return None

    def _var_names(self, var_path: str) -> tuple[str, ...] | None:
        var = self._node(var_path)
        if not isinstance(var, h5py.Group):
            return None
        keys = [attr_str(var.attrs["_index"])] if "_index" in var.attrs else []
        for key in [*keys, *VAR_NAME_KEYS]:
            if key in var:
                return read_plain_strings(var[key])
        return None

    def _obs_columns(self) -> list[str]:
        obs = self._node("obs")
        if not isinstance(obs, h5py.Group):
            return []
        index = attr_str(obs.attrs.get("_index", "_index"))
        return [k for k in obs if k not in (index, "_index", "__categories")]

    def _read_obs(self, columns: Sequence[str]) -> dict[str, Categorical]:
        obs = self._file()["obs"] if columns else None
        return (
            {c: read_plain_column(obs[c], self.path, c) for c in columns} if obs is not None else {}
        )
