"""Pixel-major spike windows: how they are packed, cropped and made into voxel grids (numpy,
torch-free).

Why pixel-major: a spike camera fires each pixel nearly periodically, so with one byte holding 8
consecutive frames of ONE pixel and each pixel's bytes contiguous, the pattern repeats byte for
byte and zstd stores the window at ~0.55 of its packed size (docs/SPIKE.md, "Codec"), against
0.87 for the camera's own (frame-major) order. The same layout makes the voxel grid cheap: when a
voxel bin holds a multiple of 8 frames (40 frames / 5 bins = 8), a bin of a pixel is the popcount
of its bytes in that bin (a 256-entry table), so nothing is ever unpacked; otherwise the bytes
are unpacked along the frame axis (``np.unpackbits``) and summed, same result. And a crop is
exact pixels (a row of a crop is ``w * K`` contiguous bytes), not whole packed bytes.

Layout (``index.json`` spike section ``bit_order = "pixel_major"``): one record's window is uint8
``[H, W, K]`` with ``K = ceil(T/8)``; byte ``[y, x, k]`` holds frames ``8k .. 8k+7`` of pixel
``(y, x)``, least significant bit = earliest frame; frames past ``T`` (``window_frames``) are
zero. The deferred op ``spike_voxel_pixel_major`` (:class:`PixelVoxels`) ships the cropped bytes;
its torch twin is in
:mod:`loaders.modalities.spike.torch_ops`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from loaders.samples.payload import Deferred, register_op

FRAME_MAJOR, PIXEL_MAJOR = "frame_major", "pixel_major"
PIXEL_VOXEL_OP = "spike_voxel_pixel_major"
POPCOUNT = np.array(
    [bin(i).count("1") for i in range(256)], np.uint8
)  # spikes in a byte of 8 frames


def popcount(bits: np.ndarray) -> np.ndarray:
    """Spikes per byte (uint8, same shape): numpy's hardware popcount ufunc (numpy >= 2.0; 5x the
    256-entry table's speed on a batch of crops), else the table."""
    count = getattr(np, "bitwise_count", None)
    return count(bits) if count is not None else POPCOUNT[bits]


def pack_pixel_major(frames: np.ndarray) -> np.ndarray:
    """0/1 frames ``[T, H, W]`` -> uint8 ``[H, W, ceil(T/8)]`` (the layout above; vectorised)."""
    t, h, w = frames.shape
    k = -(-t // 8)
    f = frames.astype(np.uint8, copy=False)
    if t != 8 * k:
        f = np.concatenate([f, np.zeros((8 * k - t, h, w), np.uint8)])
    return np.packbits(f.reshape(k, 8, h, w).transpose(2, 3, 0, 1), axis=-1, bitorder="little")[
        ..., 0
    ]


def crop_pixels(
    windows: list[np.ndarray], offsets: np.ndarray, crop: tuple[int, int] | None, clip_len: int
) -> np.ndarray:
    """uint8 ``[B*L, h, w, K]``: each record's crop at its unit's (top, left), copied (only the
    cropped pixels are shipped and counted); the whole windows without a crop."""
    if crop is None:
        return np.stack(windows)
    h, w = crop
    out = np.empty((len(windows), h, w, windows[0].shape[2]), np.uint8)
    for i, win in enumerate(windows):
        y, x = int(offsets[i // clip_len, 0]), int(offsets[i // clip_len, 1])
        out[i] = win[y : y + h, x : x + w]
    return out


def voxel_pixel_numpy(
    bits: np.ndarray, frames: int, num_bins: int, clip_len: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Pixel-major bytes ``[B*L, h, w, K]`` of ``frames`` frames -> float32 voxels ``[B, L,
    num_bins, h, w]``: popcount per byte summed over the bin's bytes when a bin holds a multiple
    of 8 frames, else the bits unpacked along the frame axis and summed (counts in uint8, uint16
    past 255 frames a bin)."""
    m, h, w, k = bits.shape
    b, per = m // max(clip_len, 1), frames // num_bins
    res = (
        np.zeros((b, clip_len, num_bins, h, w), np.float32)
        if out is None
        else out.reshape(b, clip_len, num_bins, h, w)
    )
    acc = np.uint16 if per > 255 else np.uint8
    if per % 8 == 0:
        counts = popcount(bits)  # [m, h, w, K], K = num_bins * per / 8
        sums = (
            counts if per == 8 else counts.reshape(m, h, w, num_bins, per // 8).sum(-1, dtype=acc)
        )
    else:
        unpacked = np.unpackbits(bits, axis=-1, bitorder="little")[..., :frames]
        sums = unpacked.reshape(m, h, w, num_bins, per).sum(-1, dtype=acc)
    res[...] = sums.reshape(b, clip_len, h, w, num_bins).transpose(0, 1, 4, 2, 3)
    return res


@register_op(PIXEL_VOXEL_OP, torch_module="loaders.modalities.spike.torch_ops")
def _pixel_voxel_op(
    parts: Mapping[str, np.ndarray], meta: Mapping[str, Any], out: np.ndarray | None
) -> np.ndarray:
    return voxel_pixel_numpy(
        parts["bits"], int(meta["frames"]), int(meta["num_bins"]), int(meta["clip_len"]), out
    )


@dataclass
class PixelVoxels(Deferred):
    """The voxel grid of a batch of pixel-major crops (finished in numpy or on the device)."""

    op: ClassVar[str] = PIXEL_VOXEL_OP
    bits: np.ndarray
    frames: int
    num_bins: int
    clip_len: int

    def parts(self) -> dict[str, np.ndarray]:
        return {"bits": self.bits}

    def meta(self) -> dict[str, Any]:
        return {"frames": self.frames, "num_bins": self.num_bins, "clip_len": self.clip_len}

    def out_shape(self) -> tuple[int, ...]:
        m, h, w = self.bits.shape[:3]
        return (m // self.clip_len, self.clip_len, self.num_bins, h, w)
