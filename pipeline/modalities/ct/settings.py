"""The CT kind's manifest sections: ``[ct]`` (what a record keeps of a volume: window, band, mask,
grid, cap) and ``[split]``, typed and validated into :class:`CtConfig`.

Split from :mod:`pipeline.modalities.ct.volume` (which applies the settings) and from the kind
(which writes them into ``index.json``: :func:`pipeline.modalities.ct.kind.settings_json`) so what
a manifest may say reads in one place. Every bad value is a ManifestError naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loaders.modalities.ct.samples import FEATURES
from pipeline.errors import ManifestError
from pipeline.modalities.ct.geometry import ORIENTATIONS
from pipeline.schema import Key, check, key, or_none, read

WINDOWS: dict[str, tuple[float, float]] = {  # name -> (level, width) in HU
    "lung": (-600.0, 1500.0),
    "mediastinum": (40.0, 400.0),
    "bone": (400.0, 1800.0),
}
MAX_EXTENT = int(np.iinfo(np.uint16).max) + 1  # coordinates are stored uint16
WINDOW = dict.fromkeys(("level", "width"), Key("number", finite=True))  # a custom window


def _mm(v: float) -> float | None:
    return float(v) or None


@dataclass(frozen=True)
class CtSettings:
    """[ct]: what a record keeps of a volume (window, band, mask, grid, cap); index.json holds it
    (:func:`pipeline.modalities.ct.kind.settings_json`)."""

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
        convert=or_none,
        fix="voxels on the longest axis, 2 or more (0: keep the grid)",
    )
    spacing_mm: float | None = key(
        "number", 0, finite=True, minimum=0, convert=_mm, fix="isotropic mm (0: keep the grid)"
    )
    orientation: str | None = key(
        "string", "", choices=("", *ORIENTATIONS), convert=or_none, doc='"": keep stored axes'
    )
    min_points: int = key("integer", 100, minimum=0, doc="fewer kept voxels: the record is skipped")
    max_points: int | None = key(
        "integer", 500_000, minimum=0, convert=or_none, doc="voxels kept at most (0: no cap)"
    )
    features: tuple[str, ...] = key(
        "list", tuple(FEATURES), choices=tuple(FEATURES), min_items=1, unique=True, convert=tuple
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

    @staticmethod
    def from_section(section: Any, manifest: str | Path = "manifest") -> CtSettings:
        """A ``[ct]`` table checked (:func:`pipeline.schema.read`) and resolved; a bad value
        raises ManifestError naming ``ct.<key>``."""
        return resolve(manifest, read(manifest, "ct", section, CtSettings))


@dataclass(frozen=True)
class CtConfig:
    """[split] of a CT manifest (``settings``: [ct])."""

    settings: CtSettings = field(default_factory=CtSettings)
    val_fraction: float = key("number", 0.1, minimum=0, maximum=1, convert=float)
    test_fraction: float = key("number", 0.1, minimum=0, maximum=1, convert=float)
    group: str = key("string", "file", choices=("file", "folder"), doc="what must not cross splits")


def parse_sections(path: Path, sections: Mapping[str, Any]) -> CtConfig:
    """The checked ``[ct]`` and ``[split]`` tables and the rules between their keys."""
    cfg = CtConfig(resolve(path, sections["ct"]), **sections["split"])
    total = cfg.val_fraction + cfg.test_fraction
    if total > 1.0:
        raise ManifestError(
            path, "split.test_fraction", f"val_fraction + test_fraction = {total} > 1"
        )
    return cfg


def resolve(manifest: str | Path, checked: Mapping[str, Any]) -> CtSettings:
    """The checked ``[ct]`` keys with the window and band resolved and the rules between keys
    applied."""
    v = dict(checked)
    w = v["window"]
    if isinstance(w, str):
        v["level"], v["width"] = WINDOWS[w]
    elif set(w) != {"level", "width"}:
        raise ManifestError(
            manifest, "ct.window", f"expected {{level = ..., width = ...}}, got {w!r}"
        )
    else:
        custom = read(manifest, "ct.window", w, WINDOW)
        v["window"], v["level"], v["width"] = "custom", *map(float, custom.values())
        if v["width"] <= 0:
            raise ManifestError(manifest, "ct.window.width", f"must be > 0, got {v['width']}")
    v["band"] = _band(manifest, v["band"])
    s = CtSettings(**v)
    _check_rules(manifest, s)
    return s


def _check_rules(manifest: str | Path, s: CtSettings) -> None:
    """Settings that contradict each other: ManifestError naming the key, with the fix."""

    def bad(name: str, problem: str) -> ManifestError:
        return ManifestError(manifest, f"ct.{name}", problem)

    if s.resolution == 1:
        raise bad(
            "resolution", f"expected 2..{MAX_EXTENT} voxels on the longest axis (0: keep the grid)"
        )
    if s.spacing_mm is not None and s.resolution is not None:
        raise bad(
            "spacing_mm",
            "set resolution (voxels on the longest axis) or spacing_mm (isotropic mm), not both",
        )
    if s.orientation is not None and s.axial_axis % 3 != 2:
        raise bad(
            "axial_axis",
            f"with orientation = {s.orientation!r} the axial axis is the last one (-1 or 2), got {s.axial_axis}",
        )
    if s.max_points is not None and s.max_points < max(s.min_points, 1):
        raise bad(
            "max_points",
            f"{s.max_points} is below min_points = {s.min_points} (0 means no cap)",
        )
    lo, hi = s.hu_bounds()
    if lo > hi:
        w = f"[{s.level - s.width / 2}, {s.level + s.width / 2}]"
        raise bad(
            "band",
            f"the band {list(s.band or ())} and the window {w} do not overlap: no voxel could be kept",
        )


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
