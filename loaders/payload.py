"""A batch before transport: numpy arrays, plus *deferred* items finished in numpy or on the device.

A deferred item is work that is cheaper on the device than on the host, or that makes the host-to-device
copy smaller when done after it: densifying gathered CSR rows (a 10%-dense batch crosses PCIe at ~1/5 of
its dense size), unpacking bit-packed spike windows (1/32 of float32 frames). Each is an *op*: it ships
named numpy parts plus JSON-able meta, has a numpy finisher (here, torch-free: used on the CPU and by
DataLoader workers asked for finished batches) and a torch finisher registered in :mod:`loaders.device`
under the same name; both must give equal results (tested per op).

Registry in the style of numcodecs: :func:`register_op` / :func:`get_op`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from loaders import kernels
from loaders.ops import OPS, TORCH_OPS, NumpyFinish, get_op, register_op  # noqa: F401 (re-exported)


class Deferred(ABC):
    """One deferred value of a batch (see module docstring)."""

    op: ClassVar[str]

    @abstractmethod
    def parts(self) -> dict[str, np.ndarray]:
        """The arrays shipped to the consumer (name -> array)."""

    @abstractmethod
    def meta(self) -> dict[str, Any]:
        """JSON-able parameters the finishers need (shapes, offsets)."""

    @abstractmethod
    def out_shape(self) -> tuple[int, ...]:
        """Shape of the finished value."""

    out_dtype: ClassVar[np.dtype] = np.dtype(np.float32)

    def finish(self, out: np.ndarray | None = None, zeroed: bool = True) -> np.ndarray:
        """The finished value in numpy (into ``out``, a flat buffer of the right size, if given; finishers take
        it zero-filled: ``zeroed=False`` says it holds old bytes, and it is zeroed first)."""
        if out is not None and not zeroed:
            out.fill(0)
        return get_op(self.op)(self.parts(), self.meta(), out)

    def for_device(self) -> Deferred:
        """The form this item crosses in when a device finishes it (collate's ``"positions"`` output): itself,
        unless another op is cheaper to finish there (CSR rows -> :class:`Scattered`)."""
        return self




# -- CSR rows -> dense ----------------------------------------------------------------------------------
CSR_OP = "csr_dense"


@dataclass
class Gathered(Deferred):
    """CSR rows of a batch (copies: valid after their window is recycled); dense float32 ``shape`` when
    finished (rows flattened over leading dims; ``shape[-1]`` is the column count)."""

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
        return kernels.densify(self.indptr, self.indices, self.data, int(self.shape[-1]), out,
                               zeroed).reshape(self.shape)

    def finish(self, out: np.ndarray | None = None, zeroed: bool = True) -> np.ndarray:
        return self.dense(out, zeroed)

    def for_device(self) -> Scattered:
        """The same rows as flat positions and values (what a device densifies fastest: see Scattered)."""
        return Scattered(kernels.flat_positions(self.indptr, self.indices, int(self.shape[-1])),
                         self.data if self.data.dtype == np.float32 else self.data.astype(np.float32), self.shape)

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(crow [m+1], cols [nnz], vals [nnz])`` as gathered, no copy: ``crow`` and ``cols`` share one index
        dtype (int32 unless the window holds 2**31 entries or more), what torch's sparse CSR takes as is."""
        if self.indptr.dtype != self.indices.dtype:
            return self.indptr.astype(np.int64), self.indices.astype(np.int64), self.data
        return self.indptr, self.indices, self.data


@register_op(CSR_OP)
def _csr_dense(parts: Mapping[str, np.ndarray], meta: Mapping[str, Any], out: np.ndarray | None) -> np.ndarray:
    shape = tuple(int(s) for s in meta["shape"])
    return kernels.densify(parts["crow"], parts["cols"], parts["vals"], shape[-1], out).reshape(shape)


# -- flat positions -> dense (CSR rows shipped for a device that densifies them) ---------------------------
SCATTER_OP = "scatter_dense"


@dataclass
class Scattered(Deferred):
    """Values and their int64 positions in the flattened dense ``shape`` (row * n_cols + col). Shipped instead
    of CSR parts when the consumer is a device that wants dense rows: there the finish is one zero-fill and
    one scatter, the fewest launches, at 4 more bytes per entry over PCIe (~5 us a batch at 40 GB/s)."""

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


@register_op(SCATTER_OP)
def _scatter_dense(parts: Mapping[str, np.ndarray], meta: Mapping[str, Any], out: np.ndarray | None) -> np.ndarray:
    shape = tuple(int(s) for s in meta["shape"])
    dense = np.zeros(math.prod(shape), np.float32) if out is None else out.reshape(-1)
    dense[parts["pos"]] = parts["vals"]
    return dense.reshape(shape)


@dataclass
class Payload:
    """A batch before transport: numpy arrays plus deferred items (finished by the transport)."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    xs: dict[str, Deferred] = field(default_factory=dict)
