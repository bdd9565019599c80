"""Sparse-voxel batches in the layout sparse 3-D libraries take, and seeded crops/flips of their coordinates.

Collation (torch-free numpy, run where batches are assembled): ``coords`` int32 ``[N, 4]`` = (batch index,
x, y, z) with each sample's rows contiguous and in stored (argwhere) order, as TRELLIS' ``SparseTensor``,
spconv and MinkowskiEngine take them; ``batch_dim="last"`` gives torchsparse's (x, y, z, batch). ``feats``
float32 ``[N, C]`` (channels in the order asked for), ``offsets`` int64 ``[B + 1]`` (sample ``i`` is rows
``offsets[i]:offsets[i+1]``). x, y, z are the ``.npy``'s axes 0, 1, 2.

Augmentation is split so it can run on the device without a host round trip and still equal the CPU
result: :func:`draw_augment` draws the few numbers per sample on the host (a sub-cube origin, three flip
bits), seeded by ``(seed, epoch, sample_id)`` so a volume's augmentation does not depend on which batch or
worker it lands in; :func:`augment_numpy` and :func:`augment_torch` apply them with the same integer
arithmetic. A crop keeps the points inside ``[origin, origin + extent)`` and shifts them to start at 0 (an
axis shorter than the crop is kept whole); a flip maps ``c -> extent - 1 - c``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

BATCH_DIMS = ("first", "last")


def batch_column(offsets: np.ndarray) -> np.ndarray:
    """int32 ``[N]``: the sample index of every row."""
    off = np.asarray(offsets, dtype=np.int64)
    return np.repeat(np.arange(off.size - 1, dtype=np.int32), np.diff(off))


def collate(xyz: np.ndarray, offsets: np.ndarray, features: Sequence[np.ndarray] = (),
            batch_dim: str = "first") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(coords int32 [N,4], feats float32 [N,C], offsets int64 [B+1])`` from the concatenated per-sample
    coordinates ``xyz`` ``[N, 3]`` (any integer dtype), their ``offsets`` and ``C`` feature columns ``[N]``."""
    if batch_dim not in BATCH_DIMS:
        raise ValueError(f"batch_dim must be one of {BATCH_DIMS}, got {batch_dim!r}")
    off = np.asarray(offsets, dtype=np.int64)
    n = int(off[-1]) if off.size else 0
    if xyz.shape != (n, 3):
        raise ValueError(f"coordinates are {list(xyz.shape)}, offsets say [{n}, 3]")
    coords = np.empty((n, 4), dtype=np.int32)
    b, c = (0, slice(1, 4)) if batch_dim == "first" else (3, slice(0, 3))
    coords[:, b] = batch_column(off)
    coords[:, c] = xyz
    feats = np.empty((n, len(features)), dtype=np.float32)
    for i, f in enumerate(features):
        feats[:, i] = f
    return coords, feats, off


@dataclass(frozen=True)
class Augment:
    """Per-sample crop/flip parameters, int64/bool ``[B, 3]`` each."""

    origin: np.ndarray  # first kept voxel of the sub-cube
    extent: np.ndarray  # its size (the volume's shape when not cropping)
    flip: np.ndarray  # bool: mirror this axis

    def as_torch(self, device: Any = None) -> tuple[Any, Any, Any]:
        import torch

        return (torch.as_tensor(self.origin, device=device), torch.as_tensor(self.extent, device=device),
                torch.as_tensor(self.flip, device=device))


def draw_augment(shapes: np.ndarray, sample_ids: np.ndarray, seed: int, epoch: int,
                 crop: Sequence[int] | None = None, flip: Sequence[bool] = (False, False, False)) -> Augment:
    """Draw each sample's sub-cube origin (uniform over the positions that fit) and flips (probability 1/2
    per axis where ``flip[axis]``) from ``default_rng([seed, epoch, sample_id])``."""
    shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
    extent = shapes.copy() if crop is None else np.minimum(shapes, np.asarray(crop, dtype=np.int64))
    origin = np.zeros_like(shapes)
    flips = np.zeros(shapes.shape, dtype=bool)
    want = np.asarray(flip, dtype=bool)
    for i, sid in enumerate(ids.tolist()):
        rng = np.random.default_rng([seed, epoch, sid])
        origin[i] = rng.integers(0, shapes[i] - extent[i] + 1)  # one draw per axis, always (stable streams)
        flips[i] = (rng.random(3) < 0.5) & want
    return Augment(origin, extent, flips)


def augment_numpy(coords: np.ndarray, feats: np.ndarray, offsets: np.ndarray, aug: Augment,
                  batch_dim: str = "first") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Crop and flip collated ``coords``/``feats`` (see :func:`collate`) with ``aug``; rows stay in order."""
    bcol, xyz = (0, slice(1, 4)) if batch_dim == "first" else (3, slice(0, 3))
    b = coords[:, bcol].astype(np.int64)
    rel = coords[:, xyz].astype(np.int64) - aug.origin[b]
    ext = aug.extent[b]
    keep = np.all((rel >= 0) & (rel < ext), axis=1)
    rel = np.where(aug.flip[b], ext - 1 - rel, rel)
    out = coords[keep].copy()
    out[:, xyz] = rel[keep]
    counts = np.bincount(b[keep], minlength=aug.origin.shape[0])
    off = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return out, feats[keep], off


def augment_torch(coords: Any, feats: Any, offsets: Any, aug: Augment, batch_dim: str = "first") -> tuple[Any, Any, Any]:
    """:func:`augment_numpy` on torch tensors, on their device (the same integers, so the same result)."""
    import torch

    origin, extent, flip = aug.as_torch(coords.device)
    bcol, xyz = (0, slice(1, 4)) if batch_dim == "first" else (3, slice(0, 3))
    b = coords[:, bcol].long()
    rel = coords[:, xyz].long() - origin[b]
    ext = extent[b]
    keep = ((rel >= 0) & (rel < ext)).all(dim=1)
    rel = torch.where(flip[b], ext - 1 - rel, rel)
    out = coords[keep].clone()
    out[:, xyz] = rel[keep].to(coords.dtype)
    counts = torch.bincount(b[keep], minlength=origin.shape[0])
    off = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=coords.device)
    torch.cumsum(counts, 0, out=off[1:])
    return out, feats[keep], off
