"""The torch finisher of the ``ct_coords`` deferred op (its numpy twin:
:func:`loaders.modalities.ct.ops.finish_coords`).

Kept apart from :mod:`loaders.modalities.ct.ops` so that the sample type and the decoder process
never import torch;
:mod:`loaders.engine.device` imports this module the first time it meets the op on a device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from loaders.engine.device import register_torch_op
from loaders.modalities.ct.ops import COORDS_OP


@register_torch_op(COORDS_OP)
def finish_coords_torch(parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> torch.Tensor:
    """int32 ``[N, 4]`` on the parts' device: batch column, ``xyz - origin``, flips; equal to the
    numpy result."""
    xyz, off = parts["xyz"], parts["offsets"]
    n, dev = xyz.shape[0], xyz.device
    counts = off.diff()
    b = torch.repeat_interleave(
        torch.arange(counts.numel(), device=dev, dtype=torch.int64), counts, output_size=n
    )
    rel = xyz.to(torch.int32) - parts["origin"].to(torch.int32)[b]
    ext = parts["extent"].to(torch.int32)[b]
    rel = torch.where(parts["flip"].to(torch.bool)[b], ext - 1 - rel, rel)
    coords = torch.empty((n, 4), dtype=torch.int32, device=dev)
    bcol, cols = (0, slice(1, 4)) if meta["batch_dim"] == "first" else (3, slice(0, 3))
    coords[:, bcol] = b.to(torch.int32)
    coords[:, cols] = rel
    return coords
