"""Sparse-voxel batches in the layout sparse 3-D libraries take, and seeded crops/flips of their
coordinates.

Collation (torch-free numpy, run where batches are assembled): ``coords`` int32 ``[N, 4]`` =
(batch index, x, y, z) with each sample's rows contiguous and in stored (argwhere) order, as
TRELLIS' ``SparseTensor``, spconv, MinkowskiEngine and torchsparse >= 2.1 take them;
``batch_dim="last"`` gives torchsparse < 2.1's (x, y, z, batch). ``feats`` float32 ``[N, C]`` (channels in the order asked for),
``offsets`` int64 ``[B + 1]`` (sample ``i`` is rows ``offsets[i]:offsets[i+1]``). x, y, z are the
``.npy``'s axes 0, 1, 2.

Augmentation is split so it can run on the device without a host round trip and still equal the
CPU result: :func:`draw_augment` draws the few numbers per sample on the host (a sub-cube origin,
three flip bits), from ``(seed, epoch, sample_id)`` (:func:`loaders.samples.unit_draws`) so a
volume's augmentation does not depend on which batch or worker it lands in. The crop
(:func:`crop_rows`: keep the points inside ``[origin, origin + extent)``; an axis shorter than
the crop is kept whole) runs on the host, where it shrinks what is shipped, by search over the
argwhere-ordered coordinates at the cost of the kept points (:mod:`loaders.modalities.ct.crop`:
~2.5 ms for a 2M-point volume instead of ~45-70 ms); the shift to 0, the
flips (``c -> extent - 1 - c``) and the collation into int32 ``[N, 4]`` are the deferred op
``ct_coords`` (:class:`CtCoords`), finished in numpy here or in torch on the device
(:mod:`loaders.modalities.ct.torch_ops`) with the same integer arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from loaders.modalities.ct.crop import crop_span
from loaders.samples import unit_draws
from loaders.samples.payload import Deferred, register_op

BATCH_DIMS = ("first", "last")


def batch_column(offsets: np.ndarray) -> np.ndarray:
    """int32 ``[N]``: the sample index of every row."""
    off = np.asarray(offsets, dtype=np.int64)
    return np.repeat(np.arange(off.size - 1, dtype=np.int32), np.diff(off))


def collate(
    xyz: np.ndarray,
    offsets: np.ndarray,
    features: Sequence[np.ndarray] = (),
    batch_dim: str = "first",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(coords int32 [N,4], feats float32 [N,C], offsets int64 [B+1])`` from the concatenated
    per-sample coordinates ``xyz`` ``[N, 3]`` (any integer dtype), their ``offsets`` and ``C``
    feature columns ``[N]``."""
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


def draw_augment(
    shapes: np.ndarray,
    sample_ids: np.ndarray,
    seed: int,
    epoch: int,
    crop: Sequence[int] | None = None,
    flip: Sequence[bool] = (False, False, False),
) -> Augment:
    """Draw each sample's sub-cube origin (uniform over the positions that fit) and flips
    (probability 1/2 per axis where ``flip[axis]``) from six :func:`~loaders.samples.unit_draws` of
    ``(seed, epoch, sample_id)`` (three origins, three flip bits: always drawn, so the streams do
    not depend on the options)."""
    shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
    extent = shapes.copy() if crop is None else np.minimum(shapes, np.asarray(crop, dtype=np.int64))
    draws = unit_draws(seed, epoch, ids, 6)
    origin = (draws[:, :3] % (shapes - extent + 1).astype(np.uint64)).astype(np.int64)
    flips = ((draws[:, 3:] >> np.uint64(63)) == 1) & np.asarray(flip, dtype=bool)
    return Augment(origin, extent, flips)


def crop_rows(xyz: np.ndarray, offsets: np.ndarray, aug: Augment) -> tuple[np.ndarray, np.ndarray]:
    """``(keep bool [N], new offsets [B+1])``: the rows inside each sample's sub-cube (done on the
    host, before transport: a crop makes the batch smaller, so it should cross to the device
    smaller). Each sample's rows must be in stored (argwhere) order: the sub-cube is found by
    search (:func:`loaders.modalities.ct.crop.crop_span`), not by testing every point."""
    off = np.asarray(offsets, dtype=np.int64)
    keep = np.zeros(xyz.shape[0], dtype=bool)
    new = np.zeros(off.size, dtype=np.int64)
    for i in range(off.size - 1):
        a, k = crop_span(xyz[off[i] : off[i + 1]], aug.origin[i], aug.extent[i])
        keep[off[i] + a : off[i] + a + k.size] = k
        new[i + 1] = new[i] + np.count_nonzero(k)
    return keep, new


def finish_coords(
    xyz: np.ndarray,
    offsets: np.ndarray,
    origin: np.ndarray,
    extent: np.ndarray,
    flip: np.ndarray,
    batch_dim: str = "first",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """int32 ``[N, 4]`` coordinates: the batch column plus ``xyz - origin``, mirrored where
    ``flip``.

    A loop over the batch's volumes (a handful, each ~1e5-1e6 points) of slice arithmetic, one
    ufunc call per column that casts, shifts and mirrors at once: no fancy-indexed ``[N, 3]``
    temporaries (5x faster on 1M points), no second pass for the shift (1.5x)."""
    off = np.asarray(offsets, dtype=np.int64)
    n = int(off[-1]) if off.size else 0
    coords = np.empty((n, 4), dtype=np.int32) if out is None else out.reshape(n, 4)
    bcol, c0 = (0, 1) if batch_dim == "first" else (3, 0)
    origin, extent, flip = np.asarray(origin), np.asarray(extent), np.asarray(flip, dtype=bool)
    for i in range(off.size - 1):
        src, rows = xyz[off[i] : off[i + 1]], coords[off[i] : off[i + 1]]
        rows[:, bcol] = i
        for a in range(3):  # one pass a column: cast, shift and mirror in the same ufunc call
            col, o = rows[:, c0 + a], int(origin[i, a])
            if flip[i, a]:  # extent - 1 - (c - origin) = (extent - 1 + origin) - c
                np.subtract(int(extent[i, a]) - 1 + o, src[:, a], out=col, dtype=np.int32)
            elif o:
                np.subtract(src[:, a], o, out=col, dtype=np.int32)
            else:
                col[...] = src[:, a]
    return coords


COORDS_OP = "ct_coords"


@dataclass
class CtCoords(Deferred):
    """A batch's coordinates before collation: stored uint16 ``xyz`` (6 bytes a point instead of 16
    for int32 ``[N, 4]``), offsets and the per-sample shift/flip. Finished (numpy here, torch in
    :mod:`loaders.modalities.ct.torch_ops`)
    into int32 ``[N, 4]``; on CUDA that happens on the GPU, after the smaller copy."""

    op: ClassVar[str] = COORDS_OP
    out_dtype: ClassVar[np.dtype] = np.dtype(np.int32)
    xyz: np.ndarray
    offsets: np.ndarray
    origin: np.ndarray
    extent: np.ndarray
    flip: np.ndarray
    batch_dim: str = "first"

    def parts(self) -> dict[str, np.ndarray]:
        return {
            "xyz": self.xyz,
            "offsets": self.offsets,
            "origin": self.origin,
            "extent": self.extent,
            "flip": self.flip,
        }

    def meta(self) -> dict[str, Any]:
        return {"batch_dim": self.batch_dim}

    def out_shape(self) -> tuple[int, ...]:
        return (int(self.xyz.shape[0]), 4)


@register_op(COORDS_OP, torch_module="loaders.modalities.ct.torch_ops")
def _finish_coords(
    parts: Mapping[str, np.ndarray], meta: Mapping[str, Any], out: np.ndarray | None
) -> np.ndarray:
    return finish_coords(
        parts["xyz"],
        parts["offsets"],
        parts["origin"],
        parts["extent"],
        parts["flip"],
        str(meta["batch_dim"]),
        out,
    )
