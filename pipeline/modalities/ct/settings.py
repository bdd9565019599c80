"""The ``[ct]`` manifest section: what a record keeps of a volume (window, band, mask, grid, cap).

Split from :mod:`pipeline.modalities.ct.volume` (which applies it) so the settings, their
validation and their JSON form (``index.json`` ``sections.ct.settings``) read in one place. Every
bad value is a ManifestError naming ``ct.<key>``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ManifestError
from pipeline.modalities.ct.geometry import ORIENTATIONS

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
    """The ``[ct]`` manifest section: what a record keeps of a volume. Round-trips through
    :meth:`to_json`."""

    window: str = "lung"  # a preset name, or "custom" for an explicit {level, width}
    level: float = -600.0
    width: float = 1500.0
    band: tuple[float, float] | None = (-1000.0, -400.0)
    body_mask: bool = True
    body_threshold: float = -500.0  # HU above which a voxel is tissue (the body mask's first step)
    axial_axis: int = -1
    resolution: int | None = None  # > 0: the longest axis gets this many voxels
    spacing_mm: float | None = None  # > 0: isotropic voxels this many mm wide (header spacing)
    orientation: str | None = None  # "RAS" | "LPS": stored axes reordered/flipped (a view)
    min_points: int = 100
    max_points: int | None = 500_000
    features: tuple[str, ...] = FEATURES
    # an .nhdr may name a data file outside its own folder (../, absolute): off, so a header
    # cannot pack another file's bytes unasked (docs/CT.md)
    allow_outside_data: bool = False

    def hu_bounds(self) -> tuple[int, int]:
        """Inclusive integer HU bounds of a kept voxel (window, intersected with the band)."""
        lo, hi = self.level - self.width / 2, self.level + self.width / 2
        if self.band is not None:
            lo, hi = max(lo, self.band[0]), min(hi, self.band[1])
        return math.ceil(lo), math.floor(hi)

    def to_json(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "level": self.level,
            "width": self.width,
            "band": None if self.band is None else list(self.band),
            "body_mask": self.body_mask,
            "body_threshold": self.body_threshold,
            "axial_axis": self.axial_axis,
            "resolution": self.resolution,
            "min_points": self.min_points,
            "max_points": self.max_points,
            "features": list(self.features),
            **self._new_keys(),
        }

    def _new_keys(self) -> dict[str, Any]:
        """Keys added with the NIfTI/NRRD/DICOM sources, written only when set: the settings of a
        build that uses neither read exactly as they did before."""
        new = (
            ("spacing_mm", self.spacing_mm),
            ("orientation", self.orientation),
            ("allow_outside_data", self.allow_outside_data or None),
        )
        return {k: v for k, v in new if v is not None}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> CtSettings:
        band = d.get("band")
        return CtSettings(
            window=str(d["window"]),
            level=float(d["level"]),
            width=float(d["width"]),
            band=None if band is None else (float(band[0]), float(band[1])),
            body_mask=bool(d["body_mask"]),
            body_threshold=float(d["body_threshold"]),
            axial_axis=int(d["axial_axis"]),
            resolution=None if d.get("resolution") is None else int(d["resolution"]),
            min_points=int(d["min_points"]),
            max_points=None if d.get("max_points") is None else int(d["max_points"]),
            features=tuple(str(f) for f in d["features"]),
            spacing_mm=_opt(d.get("spacing_mm"), float),
            orientation=_opt(d.get("orientation"), str),
            allow_outside_data=bool(d.get("allow_outside_data", False)),
        )

    @staticmethod
    def from_section(section: Mapping[str, Any], manifest: str | Path = "manifest") -> CtSettings:
        """Validate a manifest's ``[ct]`` table; a bad value raises ManifestError naming
        ``ct.<key>``."""

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

        known = {
            "window",
            "band",
            "body_mask",
            "body_threshold",
            "axial_axis",
            "resolution",
            "min_points",
            "max_points",
            "features",
            "spacing_mm",
            "orientation",
            "allow_outside_data",
        }
        unknown = sorted(set(section) - known)
        if unknown:
            raise bad(unknown[0], f"unknown key (known: {', '.join(sorted(known))})")
        d = CtSettings()
        w = section.get("window", d.window)
        if isinstance(w, str):
            if w not in WINDOWS:
                raise bad(
                    "window",
                    f"unknown preset {w!r} (presets: {', '.join(WINDOWS)}; or {{level, width}})",
                )
            name, (level, width) = w, WINDOWS[w]
        elif isinstance(w, Mapping) and set(w) == {"level", "width"}:
            name, level, width = (
                "custom",
                number("window.level", w["level"]),
                number("window.width", w["width"]),
            )
            if width <= 0:
                raise bad("window.width", f"must be > 0, got {width}")
        else:
            raise bad(
                "window", f"expected a preset name or {{level = ..., width = ...}}, got {w!r}"
            )
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
            raise bad(
                "resolution",
                f"expected 2..{MAX_EXTENT} voxels on the longest axis (0: keep the grid)",
            )
        spacing_mm = number("spacing_mm", section.get("spacing_mm", 0)) or None
        if spacing_mm is not None and spacing_mm < 0:
            raise bad(
                "spacing_mm", f"expected mm per voxel > 0 (0: keep the grid), got {spacing_mm}"
            )
        if spacing_mm is not None and res is not None:
            raise bad(
                "spacing_mm",
                "set resolution (voxels on the longest axis) or spacing_mm "
                "(isotropic mm), not both",
            )
        orient = section.get("orientation", "") or None
        if orient is not None and orient not in ORIENTATIONS:
            raise bad(
                "orientation",
                f'expected one of {list(ORIENTATIONS)} (or "" to keep the '
                f"stored axes), got {orient!r}",
            )
        if orient is not None and axis % 3 != 2:
            raise bad(
                "axial_axis",
                f"with orientation = {orient!r} the axial axis is the last "
                f"one (-1 or 2), got {axis}",
            )
        min_points = integer("min_points", section.get("min_points", d.min_points), 0)
        max_points = integer("max_points", section.get("max_points", d.max_points), 0) or None
        if max_points is not None and max_points < max(min_points, 1):
            raise bad(
                "max_points", f"{max_points} is below min_points = {min_points} (0 means no cap)"
            )
        outside = section.get("allow_outside_data", d.allow_outside_data)
        if not isinstance(outside, bool):
            raise bad("allow_outside_data", f"expected true or false, got {outside!r}")
        feats = section.get("features", list(d.features))
        if (
            not isinstance(feats, Sequence)
            or isinstance(feats, str)
            or not feats
            or any(f not in FEATURES for f in feats)
            or len(set(feats)) != len(feats)
        ):
            raise bad(
                "features",
                f"expected a non-empty list of distinct names among {list(FEATURES)}, got {feats!r}",
            )
        s = CtSettings(
            window=name,
            level=level,
            width=width,
            band=band,
            body_mask=body,
            body_threshold=number(
                "body_threshold", section.get("body_threshold", d.body_threshold)
            ),
            axial_axis=axis,
            resolution=res,
            min_points=min_points,
            max_points=max_points,
            features=tuple(str(f) for f in feats),
            spacing_mm=spacing_mm,
            orientation=orient,
            allow_outside_data=outside,
        )
        lo, hi = s.hu_bounds()
        if lo > hi:
            raise bad(
                "band",
                f"the band {list(band or ())} and the window [{level - width / 2}, "
                f"{level + width / 2}] do not overlap: no voxel could be kept",
            )
        return s


def _opt(v: Any, kind: type) -> Any:
    return None if v is None else kind(v)
