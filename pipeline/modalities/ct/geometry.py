"""Where a CT volume's voxels are in the patient: spacing, origin, direction, and the canonical
reorientation.

Every reader converts its header to one world frame, **RAS+ millimetres**: x grows towards the
patient's Right, y towards Anterior, z towards Superior (NIfTI's and nibabel's frame, MONAI's
default). DICOM and most NRRD files are LPS+ (ITK, 3D Slicer): their x and y are negated on the way
in, so every record's numbers follow one convention, whatever file they came from.

* ``spacing``: mm between voxel centres along each *stored* array axis;
* ``origin``: the world position of voxel (0, 0, 0)'s centre;
* ``direction``: a 3x3 matrix whose column ``j`` is the unit world direction of array axis ``j``;
* so ``world = origin + direction @ (spacing * index)``: :meth:`Geometry.affine` is that 4x4
  matrix.

``orientation = "RAS"`` (or ``"LPS"``) reorders and flips the stored axes to the closest canonical
frame, as nibabel's ``as_closest_canonical`` does (``io_orientation`` + ``ornt_transform``): a
*view* of the volume, nothing is resampled, and the axial axis is axis 2 (the last) afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import SourceError
from pipeline.extras import require

Triple = tuple[float, float, float]
Matrix = tuple[Triple, Triple, Triple]
ORIENTATIONS = ("RAS", "LPS")
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0])  # its own inverse


def _triple(v: Sequence[float] | np.ndarray) -> Triple:
    a = [float(x) for x in v]
    return (a[0], a[1], a[2])


@dataclass(frozen=True)
class Geometry:
    """A volume's header geometry in RAS+ mm (any part may be unknown: ``None``)."""

    spacing: Triple | None = None
    origin: Triple | None = None
    direction: Matrix | None = None  # row-major; column j: the world direction of array axis j
    space: str | None = None  # "RAS": origin/direction are world coordinates; None: a bare .npy

    @staticmethod
    def from_affine(affine: np.ndarray) -> Geometry:
        """Split a 4x4 RAS affine (voxel index -> mm) into spacing, origin and unit direction
        columns."""
        m = np.asarray(affine, dtype=np.float64)[:3, :3]
        spacing = np.linalg.norm(m, axis=0)
        if not np.all(np.isfinite(m)) or np.any(spacing <= 0):
            raise ValueError(f"degenerate affine (an axis of zero length): {m.tolist()}")
        d = m / spacing
        return Geometry(
            _triple(spacing),
            _triple(np.asarray(affine, np.float64)[:3, 3]),
            (_triple(d[0]), _triple(d[1]), _triple(d[2])),
            "RAS",
        )

    def matrix(self) -> np.ndarray:
        """The direction matrix (identity when unknown: a sidecar's spacing is along the array
        axes)."""
        if self.direction is None:
            return np.eye(3)
        return np.asarray(self.direction, dtype=np.float64)

    def affine(self) -> np.ndarray | None:
        """4x4 voxel index -> world mm, or None without a spacing (origin 0 when unknown)."""
        if self.spacing is None:
            return None
        a = np.eye(4)
        a[:3, :3] = self.matrix() * np.asarray(self.spacing)
        a[:3, 3] = self.origin if self.origin is not None else 0.0
        return a

    def axcodes(self) -> str | None:
        """Which world direction each array axis grows towards (e.g. ``"LPS"``), from the largest
        component of its direction column; None when the direction is unknown."""
        if self.direction is None:
            return None
        d = self.matrix()
        out = []
        for j in range(3):
            i = int(np.argmax(np.abs(d[:, j])))
            out.append(("LR", "PA", "IS")[i][int(d[i, j] > 0)])
        return "".join(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "spacing": None if self.spacing is None else list(self.spacing),
            "origin": None if self.origin is None else list(self.origin),
            "direction": None if self.direction is None else [list(r) for r in self.direction],
            "space": self.space,
            "axes": self.axcodes(),
        }

    def resampled(self, ratio: Sequence[float]) -> Geometry:
        """The geometry of a grid resampled with ``ratio[i]`` input voxels per output voxel along
        axis i, the taps placed as ``interpolate(align_corners=False)`` places them: spacing ``*
        ratio``, origin moved to the new voxel 0's centre (``0.5 * ratio - 0.5`` input voxels
        along each axis)."""
        if self.spacing is None:
            return self  # without a spacing the shift in mm is unknown: the origin is kept
        sp = self.spacing
        spacing = _triple([sp[i] * ratio[i] for i in range(3)])
        origin = self.origin
        if origin is not None:
            shift = [(0.5 * ratio[i] - 0.5) * sp[i] for i in range(3)]
            if self.direction is None:  # a sidecar: along the array axes (as .npy builds had it)
                origin = _triple([origin[i] + shift[i] for i in range(3)])
            else:
                origin = _triple(np.asarray(origin) + self.matrix() @ np.asarray(shift))
        return Geometry(spacing, origin, self.direction, self.space)


def lps_to_ras(origin: Sequence[float], columns: np.ndarray) -> tuple[Triple, np.ndarray]:
    """An LPS origin and direction/step columns (3 x k) in RAS."""
    o = LPS_TO_RAS @ np.asarray(origin, np.float64)
    return _triple(o), LPS_TO_RAS @ np.asarray(columns, np.float64)


def orientation_transform(
    geometry: Geometry, shape: Sequence[int], target: str, path: Path
) -> tuple[np.ndarray, Geometry]:
    """nibabel's ``(ornt, new geometry)`` taking the stored axes to the closest ``target`` axes
    (``RAS`` or ``LPS``): ``ornt[i] = (new axis, flip)`` of stored axis ``i``. SourceError when the
    direction is unknown."""

    require("nibabel")
    from nibabel import orientations as no  # optional extra ct

    aff = geometry.affine()
    if aff is None or geometry.direction is None:
        raise SourceError(
            path,
            f"orientation = {target!r} needs the volume's direction matrix, "
            "and this volume has none (a .npy): drop [ct] orientation, or convert "
            "it with its header",
        )
    ornt = no.ornt_transform(no.io_orientation(aff), no.axcodes2ornt(tuple(target)))
    new = Geometry.from_affine(aff @ no.inv_ornt_aff(ornt, tuple(shape)))
    return ornt, new


def apply_ornt(arr: Any, ornt: np.ndarray) -> Any:
    """The view of ``arr`` (an ndarray or memory map) that :func:`orientation_transform`'s ``ornt``
    asks for: flips, then the axis permutation (what ``nibabel.orientations.apply_orientation``
    does, kept lazy)."""
    for ax, flip in enumerate(ornt[:, 1]):
        if flip == -1:
            arr = np.flip(arr, axis=ax)
    return arr.transpose(np.argsort(ornt[:, 0]))


def is_identity(ornt: np.ndarray) -> bool:
    return bool(np.array_equal(ornt[:, 0], np.arange(3)) and np.all(ornt[:, 1] == 1))
