"""HDF5 sources read with plain h5py: the row-block machinery every HDF5 source type shares
(:class:`H5Source`), whatever its obs and var encoding.

Row blocks never go through anndata: slicing `indptr[start:stop + 1]` and then one contiguous
`data`/`indices` range is the fastest way to pull rows from an HDF5 CSR matrix, and it keeps
memory bounded by the block rather than the file. The source types subclass it and only say how
obs columns and var names are encoded: STATE / cell-load files
(:mod:`pipeline.modalities.perturbation.h5csr`) and h5ad
(:mod:`pipeline.modalities.perturbation.h5ad`, which swaps in anndata's readers for rare metadata
encodings). Why a module of its own: a source type's file conventions change without touching how
rows, obsm and structure are read and checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pipeline.errors import SourceError
from pipeline.lazy import LazyModule
from pipeline.modalities.perturbation.h5direct import DirectSlices
from pipeline.modalities.perturbation.h5open import READ_ERRORS, Layout, open_h5, var_path_for
from pipeline.modalities.perturbation.matrix import Categorical, MatrixSource, SourceMeta
from pipeline.modalities.perturbation.obs_names import (
    ObsNames,
    attr_str,
    check_obs_names,
    read_obs_names,
)
from pipeline.modalities.perturbation.validate import (
    CsrParts,
    check_float32_exact,
    validate_block,
    validate_dense,
    validate_indptr,
)

if TYPE_CHECKING:
    import h5py
    import scipy.sparse as sp
else:  # imported on first use (pipeline.lazy: declaring a source costs no heavy import)
    h5py = LazyModule("h5py")
    sp = LazyModule("scipy.sparse")


class H5Source(MatrixSource):
    """Row blocks, obsm and structural checks for any HDF5 file whose matrix is a CSR group or a
    dense dataset.

    Subclasses only say how obs columns and var names are encoded. The h5py handle is opened on
    first use, reopened after a fork and dropped when pickled, so a planner can hand sources to
    worker processes.
    """

    kinds: ClassVar[tuple[str, ...]] = ("perturbation",)
    # same_genes = true: a file without var names has the columns of the other sources (checked in
    # scan)
    options: ClassVar[tuple[str, ...]] = ("matrix", "same_genes")
    produces: ClassVar[tuple[str, ...]] = ("X", "obs/*", "obsm/*")

    def __init__(self, path: str | Path, matrix: str = "X", *, counts: bool = False) -> None:
        super().__init__(path, matrix)
        self.counts = counts  # counts matrices must not hold negative values
        self._h5: h5py.File | None = None
        self._pid: int | None = None
        self._layout: Layout | None = None
        self._obsm_layouts: dict[str, Layout] = {}
        self._direct = DirectSlices(Path(path))  # uncompressed data and indices, read by pread

    # --- subclass hooks -------------------------------------------------------------------------
    def _var_names(self, var_path: str) -> tuple[str, ...] | None:
        raise NotImplementedError

    def obs_columns(self) -> list[str]:
        with self._reading("metadata"):
            return self._obs_columns()

    def _obs_columns(self) -> list[str]:
        raise NotImplementedError

    def _read_obs(self, columns: Sequence[str]) -> dict[str, Categorical]:
        raise NotImplementedError

    # --- handle management ----------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_h5"], state["_pid"] = None, None
        state["_direct"] = DirectSlices(self._direct.path)
        return state

    def _file(self) -> h5py.File:
        if self._h5 is None or self._pid != os.getpid():
            # a handle inherited through fork is shared HDF5 state: never reuse it in the child
            self._h5, self._pid = open_h5(self.path), os.getpid()
        return self._h5

    def close(self) -> None:
        if self._h5 is not None and self._pid == os.getpid():
            self._h5.close()
        self._h5, self._pid = None, None
        self._direct.close()

    @contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        try:
            yield
        except READ_ERRORS as exc:
            raise SourceError(
                self.path, f"cannot read {what}: {type(exc).__name__}: {exc}"
            ) from exc

    def _node(self, name: str) -> h5py.Group | h5py.Dataset | None:
        """Walk a path without h5py raising on a dataset in the middle (legacy obsm is a dataset)."""
        node: Any = self._file()
        for part in name.strip("/").split("/"):
            if not isinstance(node, h5py.Group) or part not in node:
                return None
            node = node[part]
        return node

    # --- matrix layout --------------------------------------------------------------------------
    def _available_matrices(self) -> list[str]:
        f = self._file()
        found = [m for m in ("X", "raw/X", "raw.X") if self._node(m) is not None]
        layers = f.get("layers")
        if isinstance(layers, h5py.Group):
            found += [f"layers/{k}" for k in layers]
        return found + [f"obsm/{k}" for k in self._obsm_info()]

    def _array_layout(self, name: str, node: h5py.Group | h5py.Dataset, label: str) -> Layout:
        if isinstance(node, h5py.Group):
            fmt = attr_str(node.attrs.get("encoding-type", node.attrs.get("h5sparse_format", "")))
            if fmt in ("csc_matrix", "csc"):
                raise SourceError(
                    self.path,
                    f"{label} is stored as CSC; only CSR and dense matrices are supported",
                )
            missing = sorted({"data", "indices", "indptr"} - set(node.keys()))
            if missing:
                inside = [f"{name}/{k}" for k in ("X",) if k in node]  # raw: the matrix is raw/X
                hint = f'; did you mean matrix = "{inside[0]}"?' if inside else ""
                raise SourceError(
                    self.path,
                    f"{label} is a group but not a CSR matrix (missing {missing}){hint}",
                )
            shape_attr = node.attrs.get("shape", node.attrs.get("h5sparse_shape"))
            if shape_attr is None:
                names = self._var_names(var_path_for(name))
                if names is None:
                    raise SourceError(
                        self.path,
                        f"{label} has no 'shape' attribute and no var names to count columns",
                    )
                shape_attr = (node["indptr"].shape[0] - 1, len(names))
            shape = tuple(int(s) for s in np.asarray(shape_attr).ravel())
            if len(shape) != 2:
                raise SourceError(self.path, f"{label} has shape {shape}, expected 2-D")
            return Layout(name, "csr", (shape[0], shape[1]))
        if node.dtype.names is not None:
            raise SourceError(self.path, f"{label} is a compound (table) dataset, not a matrix")
        if node.ndim == 1:
            return Layout(name, "dense", (int(node.shape[0]), 1))
        if node.ndim != 2:
            raise SourceError(self.path, f"{label} has shape {node.shape}, expected 2-D")
        return Layout(name, "dense", (int(node.shape[0]), int(node.shape[1])))

    def _obsm_layout(self, key: str) -> Layout:
        if key in self._obsm_layouts:
            return self._obsm_layouts[key]
        label = f"obsm/{key}"
        with self._reading(label):
            obsm = self._node("obsm")
            if isinstance(obsm, h5py.Group) and key in obsm:
                layout = self._array_layout(f"obsm/{key}", obsm[key], label)
            elif isinstance(obsm, h5py.Dataset) and obsm.dtype.names and key in obsm.dtype.names:
                width = int(np.prod(obsm.dtype[key].shape, dtype=np.int64))
                layout = Layout("obsm", "field", (int(obsm.shape[0]), width), key)
            else:
                raise SourceError(
                    self.path,
                    f"obsm key {key!r} not found (obsm keys: {sorted(self._obsm_info())})",
                )
        self._obsm_layouts[key] = layout
        return layout

    def _matrix_layout(self) -> Layout:
        if self._layout is not None:
            return self._layout
        spec = self.matrix.strip("/")
        if spec.startswith("obsm/"):
            self._layout = self._obsm_layout(spec[len("obsm/") :])
            return self._layout
        with self._reading(f"matrix {self.matrix!r}"):
            candidates = [spec, "raw.X"] if spec == "raw/X" else [spec]  # raw.X: anndata < 0.7
            found = [(c, n) for c in candidates if (n := self._node(c)) is not None]
            if not found:
                raise SourceError(
                    self.path,
                    f"matrix {self.matrix!r} not found (available: {self._available_matrices()})",
                )
            self._layout = self._array_layout(found[0][0], found[0][1], f"matrix {self.matrix!r}")
        return self._layout

    def _obsm_info(self) -> dict[str, tuple[tuple[int, ...], str]]:
        obsm = self._node("obsm")
        info: dict[str, tuple[tuple[int, ...], str]] = {}
        if isinstance(obsm, h5py.Group):
            for key, node in obsm.items():
                if isinstance(node, h5py.Dataset):
                    info[key] = (tuple(int(s) for s in node.shape), str(node.dtype))
                elif {"data", "indptr"} <= set(node.keys()):
                    shape = node.attrs.get(
                        "shape", node.attrs.get("h5sparse_shape", (node["indptr"].shape[0] - 1,))
                    )
                    info[key] = (
                        tuple(int(s) for s in np.asarray(shape).ravel()),
                        str(node["data"].dtype),
                    )
        elif isinstance(obsm, h5py.Dataset) and obsm.dtype.names:
            for key in obsm.dtype.names:
                sub = obsm.dtype[key]
                info[key] = ((int(obsm.shape[0]), *sub.shape), str(sub.base))
        return info

    # --- metadata -------------------------------------------------------------------------------
    def _row_nnz(self, layout: Layout) -> np.ndarray:
        n_rows, n_cols = layout.shape
        if layout.kind != "csr":
            return np.full(n_rows, n_cols, dtype=np.int64)
        group = self._file()[layout.name]
        indptr = group["indptr"][()]
        if indptr.shape != (n_rows + 1,):
            raise SourceError(
                self.path,
                f"{layout.name}: indptr has {indptr.size} entries, expected n_rows + 1 = {n_rows + 1}",
            )
        if indptr[0] != 0:
            raise SourceError(self.path, f"row 0: indptr[0] is {int(indptr[0])}, expected 0")
        nnz = int(group["data"].shape[0])
        if group["indices"].shape[0] != nnz:
            raise SourceError(
                self.path,
                f"{layout.name}: indices length {group['indices'].shape[0]} does not match data length {nnz}",
            )
        validate_indptr(indptr, self.path, 0, nnz=nnz)
        return np.diff(indptr).astype(np.int64)

    def meta(
        self, obs_columns: Sequence[str], optional: Sequence[str] = (), names: bool = True
    ) -> SourceMeta:
        layout = self._matrix_layout()
        n_rows, n_cols = layout.shape
        with self._reading("metadata"):
            declared = None
            if self.matrix.strip("/").startswith("obsm/"):
                key = self.matrix.strip("/")[len("obsm/") :]
                var_names: tuple[str, ...] = tuple(f"{key}_{i}" for i in range(n_cols))
            else:
                declared = self._var_names(var_path_for(layout.name))
                var_names = (
                    declared if declared is not None else tuple(f"gene_{i}" for i in range(n_cols))
                )
            if len(var_names) != n_cols:
                raise SourceError(
                    self.path,
                    f"var has {len(var_names)} names but {self.matrix} has {n_cols} columns",
                )
            row_nnz = self._row_nnz(layout)
            available = self._obs_columns()
            missing = [c for c in obs_columns if c not in available and c not in optional]
            if missing:
                raise SourceError(
                    self.path,
                    f"missing obs column(s) {missing}; columns in the file: {', '.join(available) or 'none'}",
                )
            wanted = [c for c in dict.fromkeys([*obs_columns, *optional]) if c in available]
            obs = self._read_obs(wanted)
            for column, cat in obs.items():
                if cat.codes.shape != (n_rows,):
                    raise SourceError(
                        self.path,
                        f"obs column {column!r} has {cat.codes.size} rows, matrix has {n_rows}",
                    )
            obsm = self._obsm_info()
            if names:
                barcodes = read_obs_names(self._node("obs"), n_rows, self.path)
            else:
                check_obs_names(self._node("obs"), n_rows, self.path)
        named = self.matrix.strip("/").startswith("obsm/") or declared is not None
        return SourceMeta(
            self.path,
            n_rows,
            n_cols,
            var_names,
            row_nnz,
            obs,
            obsm,
            named_genes=named,
            obs_names=barcodes if names else None,
            has_obs_names=True,
        )

    def read_obs_names(self, n_rows: int) -> ObsNames | None:
        with self._reading("obs names"):
            return read_obs_names(self._node("obs"), n_rows, self.path)

    # --- rows -----------------------------------------------------------------------------------
    def _check_range(self, start: int, stop: int, n_rows: int) -> None:
        if not 0 <= start <= stop <= n_rows:
            raise ValueError(f"{self.path}: row range [{start}, {stop}) outside [0, {n_rows})")

    def _read_csr(self, layout: Layout, start: int, stop: int) -> sp.csr_matrix:
        group = self._file()[layout.name]
        indptr = group["indptr"]
        if indptr.shape[0] < stop + 1:
            raise SourceError(
                self.path, f"row {stop - 1}: indptr has {indptr.shape[0]} entries, needs {stop + 1}"
            )
        ptr = indptr[start : stop + 1].astype(np.int64)
        validate_indptr(ptr, self.path, start)
        lo, hi = int(ptr[0]), int(ptr[-1])
        local = ptr - lo
        raw = self._direct.read(group["data"], lo, hi, self.buffers)
        extremes = check_float32_exact(raw, self.path, start, local, self.counts)
        data = raw.astype(np.float32, copy=False)
        indices = self._direct.read(group["indices"], lo, hi, self.buffers)
        validate_block(
            CsrParts(data, indices, local, layout.shape[1]),
            self.path,
            start,
            self.counts,
            extremes if data is raw else None,  # the same values: measured once
        )
        return sp.csr_matrix((data, indices, local), shape=(stop - start, layout.shape[1]))

    def _read_dense(self, layout: Layout, start: int, stop: int) -> np.ndarray:
        node = self._file()[layout.name]
        block = (
            node.fields(layout.field)[start:stop] if layout.kind == "field" else node[start:stop]
        )
        block = np.asarray(block).reshape(stop - start, layout.shape[1])
        if layout.name != "obsm" and not layout.name.startswith(
            "obsm/"
        ):  # matrix values, not embeddings
            check_float32_exact(block, self.path, start, None, self.counts)
        return block.astype(np.float32, copy=False)

    def read_rows(self, start: int, stop: int) -> sp.csr_matrix:
        layout = self._matrix_layout()
        self._check_range(start, stop, layout.shape[0])
        with self._reading(f"rows [{start}, {stop}) of {self.matrix}"):
            if layout.kind == "csr":
                return self._read_csr(layout, start, stop)
            block = self._read_dense(layout, start, stop)
        validate_dense(block, self.path, start, self.counts, layout.shape[1])
        return sp.csr_matrix(block)

    def read_obsm(self, key: str, start: int, stop: int) -> np.ndarray:
        layout = self._obsm_layout(key)
        self._check_range(start, stop, layout.shape[0])
        with self._reading(f"rows [{start}, {stop}) of obsm/{key}"):
            if layout.kind == "csr":
                return self._read_csr(layout, start, stop).toarray()
            block = self._read_dense(layout, start, stop)
        validate_dense(block, self.path, start, counts=False, n_cols=layout.shape[1])
        return block
