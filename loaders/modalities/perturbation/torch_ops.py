"""The torch finishers of the expression-row ops (their numpy twins:
:mod:`loaders.modalities.perturbation.ops`): ``csr_dense`` and ``scatter_dense`` make dense float32
rows on whatever device the parts are, ``csr_sparse`` a torch sparse CSR tensor. Imported by
:mod:`loaders.engine.device` when it first meets one of them, never by the decoder process.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from loaders.engine.device import register_torch_op
from loaders.modalities.perturbation.ops import CSR_OP, SCATTER_OP, SPARSE_OP


def densify_torch(
    crow: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, shape: Sequence[int]
) -> torch.Tensor:
    """Device-side densify (what :func:`~loaders.modalities.perturbation.ops.densify` does on the
    CPU): one ``scatter_`` with torch index arithmetic."""
    n_cols, m, dev = int(shape[-1]), crow.numel() - 1, crow.device
    rows = torch.repeat_interleave(
        torch.arange(m, device=dev, dtype=torch.int64) * n_cols,
        crow.diff().to(torch.int64),
        output_size=cols.numel(),
    )
    out = torch.zeros(m * n_cols, dtype=torch.float32, device=dev)
    out.scatter_(0, rows + cols, vals.to(torch.float32))
    return out.view(*shape)


def sparse(crow: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, n_cols: int) -> torch.Tensor:
    """A torch sparse CSR tensor ``[m, n_cols]`` (any device). Sentences come as ``[B*L, G]``.
    Indices stay in their dtype (torch takes int32 or int64, the same for both): no host-side
    conversion pass."""
    if crow.dtype != cols.dtype:
        crow, cols = crow.to(torch.int64), cols.to(torch.int64)
    values = vals if vals.dtype == torch.float32 else vals.to(torch.float32)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        return torch.sparse_csr_tensor(
            crow, cols, values, (crow.numel() - 1, n_cols), check_invariants=False
        )


@register_torch_op(CSR_OP)
def _csr_dense_torch(parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> torch.Tensor:
    return densify_torch(
        parts["crow"], parts["cols"], parts["vals"], [int(s) for s in meta["shape"]]
    )


@register_torch_op(SCATTER_OP)
def _scatter_dense_torch(
    parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]
) -> torch.Tensor:
    """Flat positions -> dense: one zero-fill and one scatter (``densify_torch`` launches ~10
    kernels)."""
    shape = [int(s) for s in meta["shape"]]
    vals = parts["vals"]
    out = torch.zeros(math.prod(shape), dtype=torch.float32, device=vals.device)
    return out.scatter_(0, parts["pos"], vals).view(shape)


@register_torch_op(SPARSE_OP)
def _csr_sparse_torch(parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> torch.Tensor:
    return sparse(parts["crow"], parts["cols"], parts["vals"], int(meta["shape"][-1]))
