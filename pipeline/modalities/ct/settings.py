"""The ``[ct]`` manifest section: what a record keeps of a volume (window, band, mask, grid, cap).

Split from :mod:`pipeline.modalities.ct.volume` (which applies it) so the settings, their
validation and their JSON form (``index.json`` ``sections.ct.settings``) read in one place. Every
bad value is a ManifestError naming ``ct.<key>``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ManifestError
from pipeline.modalities.ct.geometry import ORIENTATIONS
from pipeline.schema import Key, check, key, read

WINDOWS: dict[str, tuple[float, float]] = {  # name -> (level, width) in HU
    "lung": (-600.0, 1500.0),
    "mediastinum": (40.0, 400.0),
    "bone": (400.0, 1800.0),
}
FEATURES = ("hu", "window")
FEATURE_DTYPES = {"hu": "int16", "window": "float16"}
MAX_EXTENT = int(np.iinfo(np.uint16).max) + 1  # coordinates are stored uint16
ADDED = ("spacing_mm", "orientation", "allow_outside_data")  # in index.json only when set
WINDOW = dict.fromkeys(("level", "width"), Key("number", finite=True))  # a custom window


def _or_none(v: Any) -> Any:
    return v or None


def _mm(v: float) -> float | None:
    return float(v) or None


@dataclass(frozen=True)
class CtSettings:
    """[ct]: what a record keeps of a volume (window, band, mask, grid, cap). Round-trips through
    :meth:`to_json`."""

    window: str = key(
        ("string", "table"),
        "lung",
        choices=tuple(WINDOWS),
        doc="a preset, or {level, width} in HU",
    )
    level: float = -600.0  # the window's, from its preset or table
    width: float = 1500.0
    band: tuple[float, float] | None = key(
        ("list", "boolean"),
        (-1000.0, -400.0),
        item="number",
        doc="[low, high] HU; [] or false: none",
    )
    body_mask: bool = key("boolean", True, doc="keep the body only (drops air outside it)")
    body_threshold: float = key(
        "number", -500.0, finite=True, convert=float, doc="HU above which a voxel is tissue"
    )
    axial_axis: int = key("integer", -1, minimum=-3, maximum=2, doc="an axis of a 3-D array")
    resolution: int | None = key(
        "integer",
        0,
        minimum=0,
        maximum=MAX_EXTENT,
        convert=_or_none,
        fix="voxels on the longest axis, 2 or more (0: keep the grid)",
    )
    spacing_mm: float | None = key(
        "number", 0, finite=True, minimum=0, convert=_mm, fix="isotropic mm (0: keep the grid)"
    )
    orientation: str | None = key(
        "string", "", choices=("", *ORIENTATIONS), convert=_or_none, doc='"": keep stored axes'
    )
    min_points: int = key("integer", 100, minimum=0, doc="fewer kept voxels: the record is skipped")
    max_points: int | None = key(
        "integer", 500_000, minimum=0, convert=_or_none, doc="voxels kept at most (0: no cap)"
    )
    features: tuple[str, ...] = key(
        "list", FEATURES, choices=FEATURES, min_items=1, unique=True, convert=tuple
    )
    allow_outside_data: bool = key(
        "boolean", False, doc="an .nhdr's data file may lie outside the .nhdr's folder"
    )

    def hu_bounds(self) -> tuple[int, int]:
        """Inclusive integer HU bounds of a kept voxel (window, intersected with the band)."""
        lo, hi = self.level - self.width / 2, self.level + self.width / 2
        if self.band is not None:
            lo, hi = max(lo, self.band[0]), min(hi, self.band[1])
        return math.ceil(lo), math.floor(hi)

    def to_json(self) -> dict[str, Any]:
        """The settings as index.json ``sections.ct.settings`` holds them. Keys added after the
        first CT builds (NIfTI/NRRD/DICOM: spacing_mm, orientation; .nhdr: allow_outside_data)
        are written only when set: the settings of a build that uses none read as before."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
        return {k: v for k, v in out.items() if k not in ADDED or v}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> CtSettings:
        """The inverse of :meth:`to_json` (lists back to tuples; absent added keys: unset)."""
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return CtSettings(**{k: v for k, v in kw.items() if k in CtSettings.__dataclass_fields__})

    @staticmethod
    def from_section(section: Any, manifest: str | Path = "manifest") -> CtSettings:
        """A ``[ct]`` table checked (:func:`pipeline.schema.read`) and resolved; a bad value
        raises ManifestError naming ``ct.<key>``."""
        return CtSettings.resolve(read(manifest, "ct", section, CtSettings), manifest)

    @staticmethod
    def resolve(checked: Mapping[str, Any], manifest: str | Path) -> CtSettings:
        """The checked ``[ct]`` keys with the window and band resolved and the rules between keys
        applied."""
        v = dict(checked)
        w = v["window"]
        if isinstance(w, str):
            v["level"], v["width"] = WINDOWS[w]
        else:
            if set(w) != {"level", "width"}:
                raise ManifestError(
                    manifest, "ct.window", f"expected {{level = ..., width = ...}}, got {w!r}"
                )
            v["window"], v["level"], v["width"] = (
                "custom",
                *(float(x) for x in read(manifest, "ct.window", w, WINDOW).values()),
            )
            if v["width"] <= 0:
                raise ManifestError(manifest, "ct.window.width", f"must be > 0, got {v['width']}")
        v["band"] = _band(manifest, v["band"])
        s = CtSettings(**v)
        problem = s.conflict()
        if problem is not None:
            raise ManifestError(manifest, f"ct.{problem[0]}", problem[1])
        return s

    def conflict(self) -> tuple[str, str] | None:
        """(key, problem) for settings that contradict each other, else None."""
        if self.resolution == 1:
            return (
                "resolution",
                f"expected 2..{MAX_EXTENT} voxels on the longest axis (0: keep the grid)",
            )
        if self.spacing_mm is not None and self.resolution is not None:
            return (
                "spacing_mm",
                "set resolution (voxels on the longest axis) or spacing_mm (isotropic mm), not both",
            )
        if self.orientation is not None and self.axial_axis % 3 != 2:
            return (
                "axial_axis",
                f"with orientation = {self.orientation!r} the axial axis is the last one (-1 or 2), got {self.axial_axis}",
            )
        if self.max_points is not None and self.max_points < max(self.min_points, 1):
            return (
                "max_points",
                f"{self.max_points} is below min_points = {self.min_points} (0 means no cap)",
            )
        lo, hi = self.hu_bounds()
        if lo > hi:
            w = f"[{self.level - self.width / 2}, {self.level + self.width / 2}]"
            return (
                "band",
                f"the band {list(self.band or ())} and the window {w} do not overlap: no voxel could be kept",
            )
        return None


def _band(manifest: str | Path, b: Any) -> tuple[float, float] | None:
    """[low, high] in HU; [] or false: no band."""
    if b is False or (not isinstance(b, bool) and len(b) == 0):
        return None
    if b is True or len(b) != 2:
        raise ManifestError(
            manifest, "ct.band", f"expected [low, high] in HU, or [] / false for none, got {b!r}"
        )
    spec = WINDOW["level"]
    lo, hi = (float(check(manifest, "ct.band", x, spec)) for x in b)
    if lo > hi:
        raise ManifestError(manifest, "ct.band", f"low end {lo} above high end {hi}")
    return lo, hi
