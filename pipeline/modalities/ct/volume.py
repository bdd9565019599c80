"""One CT volume -> windowed, masked sparse voxel coordinates (the per-volume work of kind ``ct``).

Trainers of sparse 3-D models window each 512^3 volume and ``np.argwhere`` it in every
``__getitem__`` (100-500 ms a volume, per epoch, per process). We do that once, here, and store
the answer:

* the volume is memory-mapped (``np.load(mmap_mode="r", allow_pickle=False)``) after its ``.npy``
header was
  checked (object/structured dtypes, non-3-D arrays and truncated files are refused, naming the
  file);
* values become int16 Hounsfield units (floats rounded, NaN/inf refused; out-of-range values
clipped, counted);
* optionally reoriented to ``orientation`` (RAS/LPS, a view:
  :mod:`pipeline.modalities.ct.geometry`) and resampled (:mod:`pipeline.modalities.ct.mask`):
  ``resolution`` voxels on the longest axis, or isotropic ``spacing_mm`` voxels from the header's
  real spacing;
* a voxel is kept when ``level - width/2 <= HU <= level + width/2``, inside ``band`` (inclusive)
when one is
  given, and inside the body mask when it is on;
* coordinates are array indices in the stored axis order (the ``.npy``'s, or what the reader
  returns for NIfTI/NRRD/DICOM: :mod:`pipeline.modalities.ct.formats`), sorted as ``np.argwhere``
  gives them, uint16
  ``[N, 3]``; features beside them: ``hu`` (int16) and/or ``window`` (``(HU - lo) / width``, float16
  in [0, 1]);
* more than ``max_points`` kept voxels -> a subsample of exactly ``max_points``, seeded by the
dataset seed and
  the volume's content (same volume and settings -> same points, whatever its name or the job
  order), still
  in argwhere order.

:func:`process_volume` reads a ``.npy``; :func:`process_array` is the same work on any array-like
a source opened (:mod:`pipeline.modalities.ct.formats`). Memory: the volume is read slab by slab
along axis 0 (a few MB each). What lives for the whole volume is one bool mask (0.5 x the
volume's int16 bytes) and, while the body mask is computed, one int32 label array (2 x), so the
working set is about 2.5 x the int16 bytes of the processed grid plus the output (10 bytes a
point) plus, when resampling, the resampled int16 grid itself (docs/CT.md has the measured
figures).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loaders.modalities.ct.samples import FEATURES
from pipeline.errors import SourceError
from pipeline.modalities.ct.formats import view
from pipeline.modalities.ct.geometry import (
    Geometry,
    apply_ornt,
    is_identity,
    orientation_transform,
)
from pipeline.modalities.ct.mask import (
    I16_MAX,
    I16_MIN,
    body_mask,
    grid_for,
    hu_slab,
    resample_to,
    slabs,
)
from pipeline.modalities.ct.settings import (  # noqa: F401 - re-exported: callers import them here
    MAX_EXTENT,
    WINDOWS,
    CtSettings,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VolumeInfo:
    """What the ``.npy`` header and the sidecar say, read without touching the voxels."""

    path: Path
    shape: tuple[int, int, int]
    dtype: str
    fortran_order: bool
    data_offset: int
    spacing: tuple[float, float, float] | None = None  # mm per voxel along each array axis
    origin: tuple[float, float, float] | None = None

    @property
    def voxels(self) -> int:
        return int(np.prod(self.shape))


def read_sidecar(
    path: Path,
) -> tuple[tuple[float, float, float] | None, tuple[float, float, float] | None]:
    """``<stem>.json`` beside the volume: optional ``spacing`` (mm, one per array axis) and
    ``origin``."""
    side = path.with_suffix(".json")
    if not side.exists():
        return None, None
    try:
        doc = json.loads(side.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SourceError(side, f"sidecar is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise SourceError(side, "sidecar must be a JSON object with 'spacing' and/or 'origin'")
    out: list[tuple[float, float, float] | None] = []
    for key in ("spacing", "origin"):
        v = doc.get(key)
        if v is None:
            out.append(None)
            continue
        if (
            not isinstance(v, list)
            or len(v) != 3
            or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                for x in v
            )
        ):
            raise SourceError(side, f"{key!r} must be a list of 3 finite numbers, got {v!r}")
        if key == "spacing" and min(v) <= 0:
            raise SourceError(side, f"'spacing' must be positive (mm per voxel), got {v!r}")
        out.append((float(v[0]), float(v[1]), float(v[2])))
    return out[0], out[1]


def inspect_volume(path: str | Path) -> VolumeInfo:
    """Check the ``.npy`` header and file size (never unpickling) and read the sidecar."""
    from loaders.format.tar_reader import (
        read_npy_header,  # one lock for every .npy header parse (see there)
    )

    path = Path(path)
    try:
        with open(path, "rb") as fh:
            try:
                version = np.lib.format.read_magic(fh)
            except ValueError:
                raise SourceError(path, "not a .npy file (bad magic bytes)") from None
            try:
                shape, fortran, dtype = read_npy_header(fh, version)
            except (ValueError, SyntaxError) as e:
                raise SourceError(path, f"corrupt .npy header ({e})") from None
            offset = fh.tell()
        size = path.stat().st_size
    except OSError as e:
        raise SourceError(path, f"cannot read ({e.strerror or e})") from None
    if dtype.hasobject:
        raise SourceError(path, f"dtype {dtype} holds Python objects; refused (never unpickled)")
    if dtype.kind not in "iuf" or dtype.fields is not None:
        raise SourceError(path, f"dtype {dtype} is not an integer or float volume")
    if len(shape) != 3:
        raise SourceError(
            path, f"expected a 3-D volume, got a {len(shape)}-D array of shape {tuple(shape)}"
        )
    if min(shape) < 1:
        raise SourceError(path, f"empty volume of shape {tuple(shape)}")
    need = offset + int(np.prod(shape)) * dtype.itemsize
    if size < need:
        raise SourceError(
            path,
            f"truncated .npy: {size} bytes, the header promises {need} ({tuple(shape)} {dtype})",
        )
    spacing, origin = read_sidecar(path)
    return VolumeInfo(
        path,
        (int(shape[0]), int(shape[1]), int(shape[2])),
        dtype.str,
        bool(fortran),
        offset,
        spacing,
        origin,
    )


def open_volume(info: VolumeInfo) -> np.ndarray:
    """The volume as a read-only memory map (after :func:`inspect_volume` accepted its header)."""
    try:
        return np.load(info.path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise SourceError(info.path, f"cannot memory-map ({e})") from None


def keep_digest(keep: np.ndarray) -> int:
    """64 bits of sha256 over the shape and the bit-packed keep mask (slab by slab): the subsample's
    seed comes from what the volume *is*, not from its file name or its place in the job order."""
    h = hashlib.sha256(repr(tuple(keep.shape)).encode())
    for a, b in slabs(keep.shape[0], int(np.prod(keep.shape[1:]))):
        h.update(np.packbits(keep[a:b]).tobytes())
    return int.from_bytes(h.digest()[:8], "little")


@dataclass
class CtRecord:
    """One volume's sparse voxels and what the index says about it."""

    coords: np.ndarray  # uint16 [N, 3], array indices of the (resampled) grid, argwhere order
    features: dict[str, np.ndarray]  # name -> [N] (hu int16, window float16)
    shape: tuple[int, int, int]  # the grid the coordinates index
    source_shape: tuple[int, int, int]
    source_dtype: str
    geometry: Geometry  # of the stored grid (after orientation and resampling)
    kept: int  # voxels passing window, band and mask (before max_points)
    body_voxels: int  # voxels in the body mask (-1 when the mask is off)
    clipped: int = 0  # values outside int16 clipped on conversion
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def spacing(self) -> tuple[float, float, float] | None:
        return self.geometry.spacing

    @property
    def origin(self) -> tuple[float, float, float] | None:
        return self.geometry.origin

    @property
    def points(self) -> int:
        return int(self.coords.shape[0])

    @property
    def voxels(self) -> int:
        return int(np.prod(self.shape))

    def skip_reason(self, settings: CtSettings) -> str | None:
        """Why this record is not stored (counted and logged by the kind), or None."""
        if self.points >= settings.min_points:
            return None
        if self.body_voxels == 0:
            return f"empty body mask (no voxel above {settings.body_threshold:g} HU)"
        return f"{self.points} points < min_points = {settings.min_points}"


def process_volume(
    path: str | Path, settings: CtSettings, seed: int = 0, info: VolumeInfo | None = None
) -> CtRecord:
    """Window, mask and extract one ``.npy`` volume (see the module docstring). The max_points
    subsample is drawn from ``(seed, keep_digest(mask))``: the dataset seed and the volume's own
    content."""
    info = info or inspect_volume(path)
    return process_array(
        open_volume(info),
        info.path,
        settings,
        seed,
        info.shape,
        info.dtype,
        Geometry(info.spacing, info.origin),
    )


def prepare_grid(
    vol: Any, path: Path, settings: CtSettings, geometry: Geometry
) -> tuple[Any, Geometry, int]:
    """The grid the keep rule runs on: ``orientation`` applied (a view), then resampled when asked
    (``resolution`` or ``spacing_mm``); returns it, its geometry and the values clipped on the
    way."""

    if settings.orientation is not None:
        ornt, oriented = orientation_transform(geometry, vol.shape, settings.orientation, path)
        if not is_identity(ornt):
            vol = view(vol, lambda a: apply_ornt(a, ornt))
        geometry = oriented
    _check_axial(geometry, settings, path)
    shape_in = tuple(int(n) for n in vol.shape)
    if settings.spacing_mm is not None:
        if geometry.spacing is None:
            raise SourceError(
                path,
                f"[ct] spacing_mm = {settings.spacing_mm:g} needs the "
                "volume's spacing, and it has none: give the .npy a sidecar "
                '<stem>.json with "spacing", or use resolution',
            )
        shape, ratio = grid_for(shape_in, spacing=geometry.spacing, spacing_mm=settings.spacing_mm)
    elif settings.resolution is not None and settings.resolution != max(shape_in):
        shape, ratio = grid_for(shape_in, settings.resolution)
    else:
        return vol, geometry, 0
    if max(shape) > MAX_EXTENT:
        raise SourceError(path, f"resampled shape {shape} has an axis over {MAX_EXTENT} voxels")
    out, clipped = resample_to(vol, shape, path, ratio)
    ratio = ratio or tuple(n / m for n, m in zip(shape_in, shape, strict=True))
    return out, geometry.resampled(ratio), clipped


def _check_axial(geometry: Geometry, settings: CtSettings, path: Path) -> None:
    """Warn when the header says another axis runs head to foot than ``axial_axis`` names: the body
    mask would fill its holes in sagittal or coronal slices (a coronal DICOM series, a NIfTI stored
    slices-first)."""
    if geometry.direction is None or not settings.body_mask:
        return
    head_foot = int(np.argmax(np.abs(geometry.matrix()[2])))
    if head_foot != settings.axial_axis % 3:
        log.warning(
            "%s: its axis %d runs head to foot (axes %s), but [ct] axial_axis = %d: "
            "the body mask fills holes across the wrong slices; set [ct] orientation = "
            '"RAS" (or axial_axis = %d)',
            path,
            head_foot,
            geometry.axcodes(),
            settings.axial_axis,
            head_foot,
        )


def process_array(
    vol: Any,
    path: Path,
    settings: CtSettings,
    seed: int,
    source_shape: tuple[int, int, int],
    source_dtype: str,
    geometry: Geometry,
    clipped: int = 0,
) -> CtRecord:
    """:func:`process_volume` on any array-like whose axis-0 slabs ``vol[a:b]`` are read (a memory
    map, an array in memory, :class:`~pipeline.modalities.ct.formats.Scaled`), with the header's
    geometry."""
    vol, geometry, n_clip = prepare_grid(vol, path, settings, geometry)
    clipped += n_clip
    shape = (int(vol.shape[0]), int(vol.shape[1]), int(vol.shape[2]))
    if max(shape) > MAX_EXTENT:
        raise SourceError(
            path, f"shape {shape} has an axis over {MAX_EXTENT} voxels (coordinates are uint16)"
        )
    lo, hi = settings.hu_bounds()
    lo, hi = max(lo, I16_MIN), min(hi, I16_MAX)  # HU are int16 now; an empty range keeps nothing
    row = shape[1] * shape[2]
    if settings.body_mask:
        keep = body_mask(vol, settings.body_threshold, settings.axial_axis, path)
        body_voxels = int(sum(int(np.count_nonzero(keep[a:b])) for a, b in slabs(shape[0], row)))
    else:
        keep, body_voxels = np.ones(shape, dtype=bool), -1
    counts = []
    for a, b in slabs(shape[0], row):  # keep &= lo <= HU <= hi, one slab at a time
        hu, n_clip = hu_slab(vol, a, b, path)
        clipped += n_clip
        k = keep[a:b]
        if lo > hi:
            k[...] = False
        else:
            k &= hu >= lo
            k &= hu <= hi
        counts.append(int(np.count_nonzero(k)))
    kept = int(sum(counts))
    n_out = kept if settings.max_points is None else min(kept, settings.max_points)
    chosen = None
    if n_out < kept:  # sorted positions among the kept voxels (argwhere order is preserved)
        rng = np.random.default_rng([seed, keep_digest(keep)])
        chosen = np.sort(rng.choice(kept, size=n_out, replace=False, shuffle=False))
    coords = np.empty((n_out, 3), dtype=np.uint16)
    feats = {f: np.empty(n_out, dtype=FEATURES[f]) for f in settings.features}
    first, o = 0, 0  # first kept-voxel position of the slab, output rows written
    for (a, b), c in zip(slabs(shape[0], row), counts, strict=True):
        if c:
            idx = np.nonzero(keep[a:b])
            if chosen is not None:
                sel = (
                    chosen[np.searchsorted(chosen, first) : np.searchsorted(chosen, first + c)]
                    - first
                )
                idx = tuple(i[sel] for i in idx)
            m = idx[0].size
            coords[o : o + m, 0] = idx[0] + a
            coords[o : o + m, 1] = idx[1]
            coords[o : o + m, 2] = idx[2]
            if feats:
                hu = hu_slab(vol, a, b, path)[0][idx]
                if "hu" in feats:
                    feats["hu"][o : o + m] = hu
                if "window" in feats:
                    feats["window"][o : o + m] = window_values(hu, settings)
            o += m
        first += c
    del keep
    return CtRecord(
        coords, feats, shape, source_shape, source_dtype, geometry, kept, body_voxels, clipped
    )


def window_values(hu: np.ndarray, settings: CtSettings) -> np.ndarray:
    """``(HU - (level - width/2)) / width`` clipped to [0, 1], as float16 (computed in float32)."""
    w = (hu.astype(np.float32) - np.float32(settings.level - settings.width / 2)) / np.float32(
        settings.width
    )
    return np.clip(w, 0.0, 1.0).astype(np.float16)
