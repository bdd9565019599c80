"""The torch finisher of the ``spike_voxel`` deferred op (see :mod:`loaders.samples.spike`): the packed bits
are unpacked, cropped and binned on whatever device they are on (the GPU with ``device="cuda"``). Imported by
:mod:`loaders.device` when it first meets the op, never by the decoder process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from loaders.device import register_torch_op
from loaders.samples.spike import VOXEL_OP


def voxel_torch(bits: torch.Tensor, left: torch.Tensor, width: int, num_bins: int, clip_len: int) -> torch.Tensor:
    """What :func:`loaders.samples.spike.voxel_numpy` does, with torch ops (equal results)."""
    m, t, h = bits.shape[0], bits.shape[1], bits.shape[2]
    b = m // max(clip_len, 1)
    shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
    out = torch.empty((b, clip_len, num_bins, h, width), dtype=torch.float32, device=bits.device)
    nb = -(-width // 8) + 1
    for i, x in enumerate(left.tolist()):  # B small slices
        sub = bits[i * clip_len:(i + 1) * clip_len, :, :, x // 8:x // 8 + nb]
        frames = ((sub.unsqueeze(-1) >> shifts) & 1).flatten(-2)
        sums = frames.reshape(clip_len, num_bins, t // num_bins, h, frames.shape[-1]).sum(dim=2, dtype=torch.float32)
        out[i] = sums[..., x % 8:x % 8 + width]
    return out


@register_torch_op(VOXEL_OP)
def _voxel(parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> torch.Tensor:
    return voxel_torch(parts["bits"], parts["left"], int(meta["width"]), int(meta["num_bins"]), int(meta["clip_len"]))
