"""Slab-wise voxel work on one CT volume: HU conversion, the body mask, resampling.

Split from :mod:`pipeline.modalities.ct.volume` (which decides what a record keeps) because these
are the parts whose memory matters: each walks the volume in slabs along axis 0 (``SLAB_VOXELS``
at a time) and writes into one preallocated array, so a 512^3 volume never exists as a float
copy.

Body mask, and why it is built this way: a threshold's largest connected component is the patient
(the table and stray noise are smaller components), but the lungs are air *inside* the body, so
that component excludes them. Filling holes in 3-D misses lungs connected to the outside through
the trachea (its air reaches the top of the volume); filling them per axial slice does not,
because in each slice the trachea is a hole surrounded by the neck. We fill every slice in one
``ndimage.label`` call on the background with a structure that links voxels only within the axial
plane (4-connectivity, as ``binary_fill_holes`` uses): background components touching a slice's
border are outside, every other one is a hole. Slices are independent, so that labeling runs on
slabs of slices; only the 3-D component labels span the volume (uint16 when there are fewer than
65536 components, i.e. 1 x the volume's int16 bytes; int32 otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from scipy import ndimage

from pipeline.errors import SourceError
from pipeline.modalities.ct.geometry import Geometry

SLAB_VOXELS = (
    1 << 20
)  # voxels per slab: 2 MB of int16; temporaries stay under ~8 bytes a slab voxel
I16_MIN, I16_MAX = int(np.iinfo(np.int16).min), int(np.iinfo(np.int16).max)
Triple = tuple[float, float, float]


def slabs(n0: int, row_voxels: int, rows_per_voxel: float = 1.0) -> Iterator[tuple[int, int]]:
    """``[a, b)`` ranges of axis 0 holding about SLAB_VOXELS voxels each."""
    step = max(1, int(SLAB_VOXELS / max(1.0, row_voxels * rows_per_voxel)))
    for a in range(0, n0, step):
        yield a, min(n0, a + step)


def _check_finite(s: np.ndarray, a: int, path: Path) -> None:
    if s.dtype.kind == "f" and not np.isfinite(s).all():
        bad = np.argwhere(~np.isfinite(s))[0]
        where = (int(bad[0]) + a, *(int(i) for i in bad[1:]))
        raise SourceError(
            path, f"non-finite value {s[tuple(bad)]} at index {where} (NaN/inf in a float volume)"
        )


def hu_slab(vol: np.ndarray, a: int, b: int, path: Path) -> tuple[np.ndarray, int]:
    """Rows ``[a, b)`` as int16 HU and how many values were clipped into int16's range.

    int16 volumes are returned as they are (a view of the memory map); floats are rounded to the
    nearest integer (NaN/inf raise, naming the file and the voxel); other integers are clipped."""
    s = np.asarray(vol[a:b])
    if s.dtype == np.int16:
        return s, 0
    _check_finite(s, a, path)
    if s.dtype.kind == "f":
        s = np.rint(s)
    n = 0
    if s.dtype.kind == "f" or s.dtype.itemsize > 2 or s.dtype.kind == "u":
        n = int(np.count_nonzero(s < I16_MIN)) + int(np.count_nonzero(s > I16_MAX))
    if n:
        s = np.clip(s, I16_MIN, I16_MAX)
    return s.astype(np.int16), n


def _greater(hu: np.ndarray, threshold: float, out: np.ndarray) -> None:
    """``out = hu > threshold`` in integer arithmetic (no float copy of the slab)."""
    t = math.floor(threshold)
    if t < I16_MIN:
        out[...] = True
    else:
        np.greater(hu, min(t, I16_MAX), out=out)


def _label_components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """3-D labels of ``mask``: uint16 when there are fewer than 65536 components (the usual case:
    body, table, a few specks), int32 otherwise. scipy refuses the narrow type itself when it
    would overflow."""
    for dtype in (np.uint16, np.int32):
        labels = np.empty(mask.shape, dtype=dtype)
        try:
            return labels, int(ndimage.label(mask, output=labels))
        except RuntimeError:  # "insufficient bit-depth in requested output type"
            del labels
    raise AssertionError("unreachable: int32 labels cannot overflow for a uint16-indexed grid")


def _fill_holes_per_slice(background: np.ndarray, ax: int, slab_slices: int = 16) -> None:
    """In place: ``background`` (True off the body) becomes the filled body. Slices along ``ax`` are
    independent, so this runs on slabs of slices with a slab-sized label buffer. scipy labels
    runs along the last axis; when that is the axial axis (no in-plane links along it) a slab is
    first copied slices-first, which is ~2x faster than labelling the strided view."""
    transpose = ax == background.ndim - 1
    structure = np.zeros((3, 3, 3), dtype=bool)
    plane: list[slice | int] = [slice(None)] * 3
    plane[0 if transpose else ax] = 1
    structure[tuple(plane)] = ndimage.generate_binary_structure(2, 1)
    shape = background.shape
    step = max(slab_slices, SLAB_VOXELS * shape[ax] // max(1, int(np.prod(shape))))
    for a in range(0, shape[ax], step):
        sel: list[slice] = [slice(None)] * 3
        sel[ax] = slice(a, a + step)
        view = background[tuple(sel)]
        work = np.ascontiguousarray(view.transpose(2, 0, 1)) if transpose else view
        labels = np.empty(work.shape, dtype=np.int32)
        n = int(ndimage.label(work, structure, output=labels))
        outside = np.zeros(n + 1, dtype=bool)  # components touching their slice's border
        for in_plane in (1, 2) if transpose else (i for i in range(3) if i != ax):
            for end in (0, work.shape[in_plane] - 1):
                outside[np.unique(np.take(labels, end, axis=in_plane))] = True
        outside[0] = False  # label 0: the body itself
        filled = ~outside[labels]
        view[...] = filled.transpose(1, 2, 0) if transpose else filled


def body_mask(vol: np.ndarray, threshold: float, axial_axis: int, path: Path) -> np.ndarray:
    """bool mask of the body: voxels above ``threshold`` HU, largest 6-connected component, holes
    filled per slice along ``axial_axis``. Empty when no voxel is above the threshold."""
    shape = vol.shape
    row = int(np.prod(shape[1:]))
    mask = np.empty(shape, dtype=bool)
    for a, b in slabs(shape[0], row):
        _greater(hu_slab(vol, a, b, path)[0], threshold, mask[a:b])
    labels, n = _label_components(mask)
    if n == 0:
        return mask
    sizes = np.zeros(n + 1, dtype=np.int64)
    flat = labels.reshape(-1)  # a view; bincount copies its input to int64, so a chunk at a time
    for a in range(0, flat.size, SLAB_VOXELS):
        sizes += np.bincount(flat[a : a + SLAB_VOXELS], minlength=n + 1)
    sizes[0] = 0
    largest = int(np.argmax(sizes))
    for a, b in slabs(shape[0], row):
        np.not_equal(
            labels[a:b], largest, out=mask[a:b]
        )  # mask = background (everything but the body)
    del labels, flat
    _fill_holes_per_slice(mask, axial_axis % 3)
    return mask


def _axis_weights(
    n_in: int, n_out: int, ratio: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Linear interpolation taps of one axis, as torch's ``interpolate(..., align_corners=False)``
    places them: ``ratio`` input voxels per output voxel (``n_in / n_out`` for ``size=``; ``1 /
    scale_factor`` for ``scale_factor=`` with ``recompute_scale_factor=False``, which is how
    ``spacing_mm`` resamples)."""
    scale = n_in / n_out if ratio is None else ratio
    src = np.maximum((np.arange(n_out, dtype=np.float64) + 0.5) * scale - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, (src - i0).astype(np.float32)


def grid_for(
    shape_in: tuple[int, ...],
    resolution: int | None = None,
    spacing: Triple | None = None,
    spacing_mm: float | None = None,
) -> tuple[tuple[int, int, int], Triple | None]:
    """The resampled grid and, for ``spacing_mm``, each axis's ratio (input voxels per output
    voxel): ``resolution`` voxels on the longest axis (the others keep the aspect ratio), or
    isotropic ``spacing_mm`` voxels (``floor(n * spacing / spacing_mm)`` of them, as
    ``scale_factor`` gives)."""
    if spacing_mm is not None and spacing is not None:
        ratio = (spacing_mm / spacing[0], spacing_mm / spacing[1], spacing_mm / spacing[2])
        out = tuple(max(1, math.floor(n / r)) for n, r in zip(shape_in, ratio, strict=True))
        return (out[0], out[1], out[2]), ratio
    f = (resolution or max(shape_in)) / max(shape_in)
    out = tuple(max(1, int(round(n * f))) for n in shape_in)
    return (out[0], out[1], out[2]), None


def resample_to(
    vol: np.ndarray, shape: tuple[int, ...], path: Path, ratio: Triple | None = None
) -> tuple[np.ndarray, int]:
    """Trilinear resampling of ``vol`` onto ``shape`` (taps: :func:`_axis_weights`), slab by slab;
    returns the int16 grid and how many values were clipped into int16."""
    shape_in = vol.shape
    taps = [
        _axis_weights(n, m, None if ratio is None else ratio[i])
        for i, (n, m) in enumerate(zip(shape_in, shape, strict=True))
    ]
    out = np.empty(shape, dtype=np.int16)
    clipped = 0
    (i0, i1, w0), (j0, j1, w1), (k0, k1, w2) = taps
    for a, b in slabs(shape[0], shape_in[1] * shape_in[2], shape_in[0] / shape[0]):
        r0, r1 = int(i0[a]), int(i1[b - 1]) + 1
        src = np.asarray(vol[r0:r1])
        _check_finite(src, r0, path)
        src = src.astype(np.float32)
        w = w0[a:b, None, None]
        t = src[i0[a:b] - r0] * (1 - w) + src[i1[a:b] - r0] * w
        w = w1[None, :, None]
        t = t[:, j0] * (1 - w) + t[:, j1] * w
        t = t[:, :, k0] * (1 - w2) + t[:, :, k1] * w2
        np.rint(t, out=t)
        clipped += int(np.count_nonzero(t < I16_MIN)) + int(np.count_nonzero(t > I16_MAX))
        out[a:b] = np.clip(t, I16_MIN, I16_MAX)
    return out, clipped


def resample(
    vol: np.ndarray, resolution: int, path: Path, spacing: Triple | None, origin: Triple | None
) -> tuple[np.ndarray, int, Triple | None, Triple | None]:
    """Trilinear resampling so the longest axis has ``resolution`` voxels (the others keep the
    aspect ratio), slab by slab; returns the int16 grid, values clipped, and the spacing/origin of
    the new grid (voxel centres, origin = centre of voxel 0, moved along the array axes)."""
    shape, _ = grid_for(vol.shape, resolution)
    out, clipped = resample_to(vol, shape, path)
    g = Geometry(spacing, origin).resampled([n / m for n, m in zip(vol.shape, shape, strict=True)])
    return out, clipped, g.spacing, g.origin
