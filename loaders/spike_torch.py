"""The torch finisher of the ``spike_voxel`` deferred op (see :mod:`loaders.samples.spike`): the packed bits
are unpacked, cropped and binned on whatever device they are on (the GPU with ``device="cuda"``). Imported by
:mod:`loaders.device` when it first meets the op, never by the decoder process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from loaders.device import register_torch_op
from loaders.samples.spike import VOXEL_OP


def voxel_torch(bits: torch.Tensor, offsets: torch.Tensor, width: int, num_bins: int,
                crop: tuple[int, int] | None, clip_len: int) -> torch.Tensor:
    """What :func:`loaders.samples.spike.voxel_numpy` does, with torch ops (equal results)."""
    m, t, height = bits.shape[0], bits.shape[1], bits.shape[2]
    h, w = crop if crop is not None else (height, width)
    b = m // max(clip_len, 1)
    shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
    out = torch.empty((b, clip_len, num_bins, h, w), dtype=torch.float32, device=bits.device)
    offs = offsets.tolist()  # B pairs: one small copy to the host
    for i in range(b):
        y, x = int(offs[i][0]), int(offs[i][1])
        sub = bits[i * clip_len:(i + 1) * clip_len, :, y:y + h, x // 8:-(-(x + w) // 8)]
        frames = ((sub.unsqueeze(-1) >> shifts) & 1).flatten(-2)[..., x % 8:x % 8 + w]
        out[i] = frames.reshape(clip_len, num_bins, t // num_bins, h, w).sum(dim=2, dtype=torch.float32)
    return out


@register_torch_op(VOXEL_OP)
def _voxel(parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> torch.Tensor:
    crop = tuple(meta["crop"]) if meta["crop"] is not None else None
    return voxel_torch(parts["bits"], parts["offsets"], int(meta["width"]), int(meta["num_bins"]), crop,  # type: ignore[arg-type]
                       int(meta["clip_len"]))
