"""The torch finishers of the spike voxel ops: ``spike_voxel`` (frame-major bits,
:mod:`loaders.modalities.spike.samples`)
and ``spike_voxel_pixel_major`` (:mod:`loaders.modalities.spike.ops`): the packed bits are
unpacked or popcounted, cropped and binned on whatever device they are on (the GPU with
``device="cuda"``). Imported by
:mod:`loaders.engine.device`
when it first meets an op, never by the decoder process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from loaders.engine.device import register_torch_op
from loaders.modalities.spike.ops import PIXEL_VOXEL_OP
from loaders.modalities.spike.samples import VOXEL_OP


def voxel_torch(
    bits: torch.Tensor, left: torch.Tensor, width: int, num_bins: int, clip_len: int
) -> torch.Tensor:
    """What :func:`loaders.modalities.spike.samples.voxel_numpy` does, with torch ops (equal
    results)."""
    m, t, h = bits.shape[0], bits.shape[1], bits.shape[2]
    b = m // max(clip_len, 1)
    shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
    out = torch.empty((b, clip_len, num_bins, h, width), dtype=torch.float32, device=bits.device)
    nb = -(-width // 8) + 1
    for i, x in enumerate(left.tolist()):  # B small slices
        sub = bits[i * clip_len : (i + 1) * clip_len, :, :, x // 8 : x // 8 + nb]
        frames = ((sub.unsqueeze(-1) >> shifts) & 1).flatten(-2)
        sums = frames.reshape(clip_len, num_bins, t // num_bins, h, frames.shape[-1]).sum(
            dim=2, dtype=torch.float32
        )
        out[i] = sums[..., x % 8 : x % 8 + width]
    return out


@register_torch_op(VOXEL_OP)
def _voxel(parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> torch.Tensor:
    return voxel_torch(
        parts["bits"],
        parts["left"],
        int(meta["width"]),
        int(meta["num_bins"]),
        int(meta["clip_len"]),
    )


def popcount8(x: torch.Tensor) -> torch.Tensor:
    """Set bits of every uint8 (SWAR: three shift-and-mask rounds, no table gather on the device)."""
    x = x - ((x >> 1) & 0x55)
    x = (x & 0x33) + ((x >> 2) & 0x33)
    return (x + (x >> 4)) & 0x0F


def voxel_pixel_torch(
    bits: torch.Tensor, frames: int, num_bins: int, clip_len: int
) -> torch.Tensor:
    """What :func:`loaders.modalities.spike.ops.voxel_pixel_numpy` does, with torch ops (equal
    results)."""
    m, h, w, _ = bits.shape
    per = frames // num_bins
    if per % 8 == 0:
        counts = popcount8(bits).reshape(m, h, w, num_bins, per // 8)
    else:
        shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
        counts = (
            ((bits.unsqueeze(-1) >> shifts) & 1)
            .flatten(-2)[..., :frames]
            .reshape(m, h, w, num_bins, per)
        )
    sums = counts.sum(dim=-1, dtype=torch.float32)
    return sums.reshape(m // clip_len, clip_len, h, w, num_bins).permute(0, 1, 4, 2, 3).contiguous()


@register_torch_op(PIXEL_VOXEL_OP)
def _pixel_voxel(parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> torch.Tensor:
    return voxel_pixel_torch(
        parts["bits"], int(meta["frames"]), int(meta["num_bins"]), int(meta["clip_len"])
    )
