"""Expression rows as deferred items: a batch's CSR rows, finished dense, as torch sparse, or as
their parts.

The gather of a ``csr`` field is generic (:mod:`loaders.samples.gather`, :mod:`loaders.samples.kernels`); what the
gathered rows become is this modality's, chosen by the sample type's load-time options
(``densify``, ``torch_sparse``), each a deferred op with a numpy finisher here and its torch twin
in :mod:`loaders.modalities.perturbation.torch_ops`:

* :class:`Gathered` (op ``csr_dense``): dense float32 rows. For a device that densifies them it
  crosses as :class:`Scattered` (op ``scatter_dense``): flat positions and values, one zero-fill
  and one scatter there;
* :class:`CsrParts` (``densify=False``): the CSR parts themselves, ``key.crow`` / ``key.cols`` /
  ``key.vals`` (zero-copy views of the gather's output; no per-batch conversion);
* :class:`SparseRows` (``densify=False, torch_sparse=True``, op ``csr_sparse``, torch-only): a
  torch sparse CSR tensor ``[m, n_cols]`` built from those parts wherever they are.

Torch-free: the decoder process and DataLoader workers import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from loaders.samples import kernels
from loaders.samples.ops import LAYOUT_ITEMS, register_op, register_torch_only_op
from loaders.samples.payload import PARTS, Deferred

TORCH_MODULE = "loaders.modalities.perturbation.torch_ops"
CSR_OP = "csr_dense"
SCATTER_OP = "scatter_dense"
SPARSE_OP = "csr_sparse"
# the forms a batch's rows are delivered in (ShardDataset's densify / torch_sparse pick one)
DENSE, CSR, SPARSE = "dense", "csr", "sparse"
FORMS = (DENSE, CSR, SPARSE)


def form_of(densify: bool, torch_sparse: bool) -> str:
    """The delivery form the options ask for: dense rows, or (``densify=False``) CSR parts or a
    torch sparse tensor (``torch_sparse=True``; without ``densify=False`` it changes nothing, as it
    always did)."""
    return DENSE if densify else (SPARSE if torch_sparse else CSR)


# -- CSR rows -> dense ---------------------------------------------------------------------------
@dataclass
class Gathered(Deferred):
    """CSR rows of a batch (copies: valid after their window is recycled); dense float32 ``shape``
    when finished (rows flattened over leading dims; ``shape[-1]`` is the column count)."""

    op: ClassVar[str] = CSR_OP
    indptr: np.ndarray  # [m+1], the dtype of ``indices``
    indices: np.ndarray  # [nnz]
    data: np.ndarray  # [nnz]
    shape: tuple[int, ...]

    def parts(self) -> dict[str, np.ndarray]:
        crow, cols, vals = self.csr()
        return {"crow": crow, "cols": cols, "vals": vals}

    def meta(self) -> dict[str, Any]:
        return {"shape": [int(s) for s in self.shape]}

    def out_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.shape)

    def dense(self, out: np.ndarray | None = None, zeroed: bool = True) -> np.ndarray:
        return kernels.densify(
            self.indptr, self.indices, self.data, int(self.shape[-1]), out, zeroed
        ).reshape(self.shape)

    def finish(self, out: np.ndarray | None = None, zeroed: bool = True) -> np.ndarray:
        return self.dense(out, zeroed)

    def for_device(self) -> Deferred:
        """The same rows as flat positions and values (what a device densifies fastest: see
        Scattered)."""
        vals = self.data if self.data.dtype == np.float32 else self.data.astype(np.float32)
        return Scattered(
            kernels.flat_positions(self.indptr, self.indices, int(self.shape[-1])), vals, self.shape
        )

    def as_form(self, form: str) -> Deferred:
        """The same rows delivered as :data:`FORMS` ``form`` (another name: themselves)."""
        make = ROWS_AS.get(form)
        if make is None or type(self) is make:
            return self
        return make(self.indptr, self.indices, self.data, self.shape)

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(crow [m+1], cols [nnz], vals [nnz])`` as gathered, no copy: ``crow`` and ``cols``
        share one index dtype (int32 unless the window holds 2**31 entries or more), what torch's
        sparse CSR takes as is."""
        if self.indptr.dtype != self.indices.dtype:
            return self.indptr.astype(np.int64), self.indices.astype(np.int64), self.data
        return self.indptr, self.indices, self.data


@register_op(CSR_OP, torch_module=TORCH_MODULE)
def _csr_dense(
    parts: Mapping[str, np.ndarray], meta: Mapping[str, Any], out: np.ndarray | None
) -> np.ndarray:
    shape = tuple(int(s) for s in meta["shape"])
    return kernels.densify(parts["crow"], parts["cols"], parts["vals"], shape[-1], out).reshape(
        shape
    )


def densify(
    crow: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: tuple[int, ...] | list[int]
) -> np.ndarray:
    """Dense float32 ``shape`` (rows flattened over leading dims) from shipped CSR parts, on the
    CPU."""
    return _csr_dense({"crow": crow, "cols": cols, "vals": vals}, {"shape": list(shape)}, None)


LAYOUT_ITEMS.register("csr", Gathered)  # what a generic ``Rows.csr`` gather returns


# -- the other forms -----------------------------------------------------------------------------
class CsrParts(Gathered):
    """The rows delivered as their CSR parts (``key.crow``, ``key.cols``, ``key.vals``), never
    finished."""

    delivery: ClassVar[str] = PARTS

    def for_device(self) -> Deferred:
        return self


class SparseRows(Gathered):
    """The rows as a torch sparse CSR tensor ``[m, n_cols]`` (sentences: ``[B*L, G]``), built by the
    torch-only op ``csr_sparse`` from the parts wherever they are (the host, or the device)."""

    op: ClassVar[str] = SPARSE_OP

    def out_shape(self) -> tuple[int, ...]:
        return (math.prod(int(s) for s in self.shape[:-1]), int(self.shape[-1]))

    def for_device(self) -> Deferred:
        return self


register_torch_only_op(SPARSE_OP, TORCH_MODULE)
ROWS_AS: dict[str, type[Gathered]] = {DENSE: Gathered, CSR: CsrParts, SPARSE: SparseRows}


# -- flat positions -> dense (CSR rows shipped for a device that densifies them) -----------------
@dataclass
class Scattered(Deferred):
    """Values and their int64 positions in the flattened dense ``shape`` (row * n_cols + col).
    Shipped instead of CSR parts when the consumer is a device that wants dense rows: there the
    finish is one zero-fill and one scatter, the fewest launches, at 4 more bytes per entry over
    PCIe (~5 us a batch at 40 GB/s)."""

    op: ClassVar[str] = SCATTER_OP
    pos: np.ndarray  # int64 [nnz]
    vals: np.ndarray  # float32 [nnz]
    shape: tuple[int, ...]

    def parts(self) -> dict[str, np.ndarray]:
        return {"pos": self.pos, "vals": self.vals}

    def meta(self) -> dict[str, Any]:
        return {"shape": [int(s) for s in self.shape]}

    def out_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.shape)


@register_op(SCATTER_OP, torch_module=TORCH_MODULE)
def _scatter_dense(
    parts: Mapping[str, np.ndarray], meta: Mapping[str, Any], out: np.ndarray | None
) -> np.ndarray:
    shape = tuple(int(s) for s in meta["shape"])
    dense = np.zeros(math.prod(shape), np.float32) if out is None else out.reshape(-1)
    dense[parts["pos"]] = parts["vals"]
    return dense.reshape(shape)
