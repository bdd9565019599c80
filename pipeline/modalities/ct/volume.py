"""One CT ``.npy`` volume -> windowed, masked sparse voxel coordinates (the per-volume work of kind ``ct``).

Trainers of sparse 3-D models window each 512^3 volume and ``np.argwhere`` it in every ``__getitem__``
(100-500 ms a volume, per epoch, per process). We do that once, here, and store the answer:

* the volume is memory-mapped (``np.load(mmap_mode="r", allow_pickle=False)``) after its ``.npy`` header was
  checked (object/structured dtypes, non-3-D arrays and truncated files are refused, naming the file);
* values become int16 Hounsfield units (floats rounded, NaN/inf refused; out-of-range values clipped, counted);
* optionally resampled (:mod:`pipeline.modalities.ct.mask`) so the longest axis has ``resolution`` voxels;
* a voxel is kept when ``level - width/2 <= HU <= level + width/2``, inside ``band`` (inclusive) when one is
  given, and inside the body mask when it is on;
* coordinates are array indices in the ``.npy``'s own axis order, sorted as ``np.argwhere`` gives them, uint16
  ``[N, 3]``; features beside them: ``hu`` (int16) and/or ``window`` (``(HU - lo) / width``, float16 in [0, 1]);
* more than ``max_points`` kept voxels -> a subsample of exactly ``max_points``, seeded by the dataset seed and
  the volume's content (same volume and settings -> same points, whatever its name or the job order), still
  in argwhere order.

Memory: the volume is read slab by slab along axis 0 (a few MB each). What lives for the whole volume is one
bool mask (0.5 x the volume's int16 bytes) and, while the body mask is computed, one int32 label array (2 x),
so the working set is about 2.5 x the int16 bytes of the processed grid plus the output (10 bytes a point)
plus, when resampling, the resampled int16 grid itself (docs/CT.md has the measured figures).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ManifestError, SourceError
from pipeline.modalities.ct.mask import I16_MAX, I16_MIN, body_mask, hu_slab, resample, slabs

WINDOWS: dict[str, tuple[float, float]] = {  # name -> (level, width) in HU
    "lung": (-600.0, 1500.0),
    "mediastinum": (40.0, 400.0),
    "bone": (400.0, 1800.0),
}
FEATURES = ("hu", "window")
FEATURE_DTYPES = {"hu": "int16", "window": "float16"}
MAX_EXTENT = int(np.iinfo(np.uint16).max) + 1  # coordinates are stored uint16


@dataclass(frozen=True)
class CtSettings:
    """The ``[ct]`` manifest section: what a record keeps of a volume. Round-trips through :meth:`to_json`."""

    window: str = "lung"  # a preset name, or "custom" for an explicit {level, width}
    level: float = -600.0
    width: float = 1500.0
    band: tuple[float, float] | None = (-1000.0, -400.0)
    body_mask: bool = True
    body_threshold: float = -500.0  # HU above which a voxel is tissue (the body mask's first step)
    axial_axis: int = -1
    resolution: int | None = None
    min_points: int = 100
    max_points: int | None = 500_000
    features: tuple[str, ...] = FEATURES

    def hu_bounds(self) -> tuple[int, int]:
        """Inclusive integer HU bounds of a kept voxel (window, intersected with the band)."""
        lo, hi = self.level - self.width / 2, self.level + self.width / 2
        if self.band is not None:
            lo, hi = max(lo, self.band[0]), min(hi, self.band[1])
        return math.ceil(lo), math.floor(hi)

    def to_json(self) -> dict[str, Any]:
        return {"window": self.window, "level": self.level, "width": self.width,
                "band": None if self.band is None else list(self.band), "body_mask": self.body_mask,
                "body_threshold": self.body_threshold, "axial_axis": self.axial_axis,
                "resolution": self.resolution, "min_points": self.min_points, "max_points": self.max_points,
                "features": list(self.features)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> CtSettings:
        band = d.get("band")
        return CtSettings(window=str(d["window"]), level=float(d["level"]), width=float(d["width"]),
                          band=None if band is None else (float(band[0]), float(band[1])),
                          body_mask=bool(d["body_mask"]), body_threshold=float(d["body_threshold"]),
                          axial_axis=int(d["axial_axis"]),
                          resolution=None if d.get("resolution") is None else int(d["resolution"]),
                          min_points=int(d["min_points"]),
                          max_points=None if d.get("max_points") is None else int(d["max_points"]),
                          features=tuple(str(f) for f in d["features"]))

    @staticmethod
    def from_section(section: Mapping[str, Any], manifest: str | Path = "manifest") -> CtSettings:
        """Validate a manifest's ``[ct]`` table; a bad value raises ManifestError naming ``ct.<key>``."""

        def bad(key: str, problem: str) -> ManifestError:
            return ManifestError(manifest, f"ct.{key}", problem)

        def number(key: str, v: Any) -> float:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise bad(key, f"expected a finite number, got {v!r}")
            return float(v)

        def integer(key: str, v: Any, lo: int) -> int:
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise bad(key, f"expected an integer >= {lo}, got {v!r}")
            return int(v)

        known = {"window", "band", "body_mask", "body_threshold", "axial_axis", "resolution", "min_points",
                 "max_points", "features"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise bad(unknown[0], f"unknown key (known: {', '.join(sorted(known))})")
        d = CtSettings()
        w = section.get("window", d.window)
        if isinstance(w, str):
            if w not in WINDOWS:
                raise bad("window", f"unknown preset {w!r} (presets: {', '.join(WINDOWS)}; or {{level, width}})")
            name, (level, width) = w, WINDOWS[w]
        elif isinstance(w, Mapping) and set(w) == {"level", "width"}:
            name, level, width = "custom", number("window.level", w["level"]), number("window.width", w["width"])
            if width <= 0:
                raise bad("window.width", f"must be > 0, got {width}")
        else:
            raise bad("window", f"expected a preset name or {{level = ..., width = ...}}, got {w!r}")
        b = section.get("band", list(d.band or ()))
        if b is False or (isinstance(b, Sequence) and not isinstance(b, str) and len(b) == 0):
            band = None
        elif isinstance(b, Sequence) and not isinstance(b, str) and len(b) == 2:
            band = (number("band", b[0]), number("band", b[1]))
            if band[0] > band[1]:
                raise bad("band", f"low end {band[0]} above high end {band[1]}")
        else:
            raise bad("band", f"expected [low, high] in HU, or [] / false for none, got {b!r}")
        body = section.get("body_mask", d.body_mask)
        if not isinstance(body, bool):
            raise bad("body_mask", f"expected true or false, got {body!r}")
        axis = section.get("axial_axis", d.axial_axis)
        if isinstance(axis, bool) or not isinstance(axis, int) or not -3 <= axis <= 2:
            raise bad("axial_axis", f"expected an axis of a 3-D array (-3..2), got {axis!r}")
        res = section.get("resolution", 0)
        res = integer("resolution", res, 0) or None
        if res is not None and (res < 2 or res > MAX_EXTENT):
            raise bad("resolution", f"expected 2..{MAX_EXTENT} voxels on the longest axis (0: keep the grid)")
        min_points = integer("min_points", section.get("min_points", d.min_points), 0)
        max_points = integer("max_points", section.get("max_points", d.max_points), 0) or None
        if max_points is not None and max_points < max(min_points, 1):
            raise bad("max_points", f"{max_points} is below min_points = {min_points} (0 means no cap)")
        feats = section.get("features", list(d.features))
        if (not isinstance(feats, Sequence) or isinstance(feats, str) or not feats
                or any(f not in FEATURES for f in feats) or len(set(feats)) != len(feats)):
            raise bad("features", f"expected a non-empty list of distinct names among {list(FEATURES)}, got {feats!r}")
        s = CtSettings(window=name, level=level, width=width, band=band, body_mask=body,
                       body_threshold=number("body_threshold", section.get("body_threshold", d.body_threshold)),
                       axial_axis=axis, resolution=res, min_points=min_points, max_points=max_points,
                       features=tuple(str(f) for f in feats))
        lo, hi = s.hu_bounds()
        if lo > hi:
            raise bad("band", f"the band {list(band or ())} and the window [{level - width / 2}, "
                              f"{level + width / 2}] do not overlap: no voxel could be kept")
        return s


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


def read_sidecar(path: Path) -> tuple[tuple[float, float, float] | None, tuple[float, float, float] | None]:
    """``<stem>.json`` beside the volume: optional ``spacing`` (mm, one per array axis) and ``origin``."""
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
        if (not isinstance(v, list) or len(v) != 3
                or not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in v)):
            raise SourceError(side, f"{key!r} must be a list of 3 finite numbers, got {v!r}")
        if key == "spacing" and min(v) <= 0:
            raise SourceError(side, f"'spacing' must be positive (mm per voxel), got {v!r}")
        out.append((float(v[0]), float(v[1]), float(v[2])))
    return out[0], out[1]


def inspect_volume(path: str | Path) -> VolumeInfo:
    """Check the ``.npy`` header and file size (never unpickling) and read the sidecar."""
    from loaders.shardio import read_npy_header  # one lock for every .npy header parse (see there)

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
        raise SourceError(path, f"expected a 3-D volume, got a {len(shape)}-D array of shape {tuple(shape)}")
    if min(shape) < 1:
        raise SourceError(path, f"empty volume of shape {tuple(shape)}")
    need = offset + int(np.prod(shape)) * dtype.itemsize
    if size < need:
        raise SourceError(path, f"truncated .npy: {size} bytes, the header promises {need} ({tuple(shape)} {dtype})")
    spacing, origin = read_sidecar(path)
    return VolumeInfo(path, (int(shape[0]), int(shape[1]), int(shape[2])), dtype.str, bool(fortran), offset,
                      spacing, origin)


def open_volume(info: VolumeInfo) -> np.ndarray:
    """The volume as a read-only memory map (after :func:`inspect_volume` accepted its header)."""
    try:
        return np.load(info.path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise SourceError(info.path, f"cannot memory-map ({e})") from None


def keep_digest(keep: np.ndarray) -> int:
    """64 bits of sha256 over the shape and the bit-packed keep mask (slab by slab): the subsample's seed
    comes from what the volume *is*, not from its file name or its place in the job order."""
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
    spacing: tuple[float, float, float] | None
    origin: tuple[float, float, float] | None
    kept: int  # voxels passing window, band and mask (before max_points)
    body_voxels: int  # voxels in the body mask (-1 when the mask is off)
    clipped: int = 0  # values outside int16 clipped on conversion
    stats: dict[str, Any] = field(default_factory=dict)

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


def process_volume(path: str | Path, settings: CtSettings, seed: int = 0,
                   info: VolumeInfo | None = None) -> CtRecord:
    """Window, mask and extract one volume (see the module docstring). The max_points subsample is drawn from
    ``(seed, keep_digest(mask))``: the dataset seed and the volume's own content."""
    info = info or inspect_volume(path)
    vol: np.ndarray = open_volume(info)
    clipped = 0
    spacing, origin = info.spacing, info.origin
    if settings.resolution is not None and settings.resolution != max(info.shape):
        vol, clipped, spacing, origin = resample(vol, settings.resolution, info.path, spacing, origin)
    shape = (int(vol.shape[0]), int(vol.shape[1]), int(vol.shape[2]))
    if max(shape) > MAX_EXTENT:
        raise SourceError(info.path, f"shape {shape} has an axis over {MAX_EXTENT} voxels (coordinates are uint16)")
    lo, hi = settings.hu_bounds()
    lo, hi = max(lo, I16_MIN), min(hi, I16_MAX)  # HU are int16 now; an empty range keeps nothing
    row = shape[1] * shape[2]
    if settings.body_mask:
        keep = body_mask(vol, settings.body_threshold, settings.axial_axis, info.path)
        body_voxels = int(sum(int(np.count_nonzero(keep[a:b])) for a, b in slabs(shape[0], row)))
    else:
        keep, body_voxels = np.ones(shape, dtype=bool), -1
    counts = []
    for a, b in slabs(shape[0], row):  # keep &= lo <= HU <= hi, one slab at a time
        hu, n_clip = hu_slab(vol, a, b, info.path)
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
    feats = {f: np.empty(n_out, dtype=FEATURE_DTYPES[f]) for f in settings.features}
    first, o = 0, 0  # first kept-voxel position of the slab, output rows written
    for (a, b), c in zip(slabs(shape[0], row), counts, strict=True):
        if c:
            idx = np.nonzero(keep[a:b])
            if chosen is not None:
                sel = chosen[np.searchsorted(chosen, first):np.searchsorted(chosen, first + c)] - first
                idx = tuple(i[sel] for i in idx)
            m = idx[0].size
            coords[o:o + m, 0] = idx[0] + a
            coords[o:o + m, 1] = idx[1]
            coords[o:o + m, 2] = idx[2]
            if feats:
                hu = hu_slab(vol, a, b, info.path)[0][idx]
                if "hu" in feats:
                    feats["hu"][o:o + m] = hu
                if "window" in feats:
                    feats["window"][o:o + m] = window_values(hu, settings)
            o += m
        first += c
    del keep
    return CtRecord(coords, feats, shape, info.shape, info.dtype, spacing, origin, kept, body_voxels, clipped)


def window_values(hu: np.ndarray, settings: CtSettings) -> np.ndarray:
    """``(HU - (level - width/2)) / width`` clipped to [0, 1], as float16 (computed in float32)."""
    w = (hu.astype(np.float32) - np.float32(settings.level - settings.width / 2)) / np.float32(settings.width)
    return np.clip(w, 0.0, 1.0).astype(np.float16)
