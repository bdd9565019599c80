"""The independent CT reference: what a record must hold, written the obvious whole-volume way (the
``reference_points`` and ``reference_body`` fixtures, tests/modalities/ct/conftest.py).

No slabs, no shared label buffer, no lookup table: threshold, ``ndimage.label``, largest
component by ``bincount``, ``binary_fill_holes`` on every axial slice in a Python loop,
``np.argwhere``. The CT tests compare the pipeline and the loader against ``reference_points``;
the tests in this file pin the reference itself to hand-made volumes, so a bug shared by both
cannot hide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def _ring_volume() -> np.ndarray:
    """8 x 8 x 3: a square body ring (0 HU) with an air hole (-900) in every slice, air (-1000)
    outside, plus a separate 1-voxel speck of tissue in a corner (not the largest component)."""
    v = np.full((8, 8, 3), -1000, dtype=np.int16)
    v[1:7, 1:7, :] = 0
    v[3:5, 3:5, :] = -900
    v[7, 7, 0] = 0
    return v


def test_reference_fills_the_hole_and_drops_the_speck(
    reference_body: Callable[..., Any], reference_points: Callable[..., Any]
) -> None:
    v = _ring_volume()
    body = reference_body(v)
    assert (
        body.sum() == 6 * 6 * 3
    )  # ring + hole, every slice; the speck is not the largest component
    assert not body[7, 7, 0]
    coords, hu, window = reference_points(
        v
    )  # band [-1000, -400] inside the body: the 2 x 2 x 3 hole
    assert coords.tolist() == [[i, j, k] for i in (3, 4) for j in (3, 4) for k in range(3)]
    assert hu.tolist() == [-900] * 12
    assert np.allclose(window.astype(np.float64), (-900 + 1350) / 1500, atol=1e-3)


def test_reference_without_mask_or_band_keeps_the_window(
    reference_points: Callable[..., Any],
) -> None:
    v = _ring_volume()
    coords, hu, _ = reference_points(v, band=None, body=False)  # window [-1350, 150]: everything
    assert coords.shape == (8 * 8 * 3, 3)
    coords, _, _ = reference_points(
        v, level=40, width=400, band=None, body=False
    )  # [-160, 240]: tissue only
    assert len(coords) == (36 - 4) * 3 + 1


def test_reference_hole_through_the_top_is_filled_per_slice_not_in_3d(
    reference_body: Callable[..., Any],
) -> None:
    v = _ring_volume()
    v[
        3:5, 3:5, :
    ] = -1000  # an air channel open at both axial ends (a trachea reaching the volume's faces)
    assert reference_body(v).sum() == 36 * 3
    assert reference_body(v, fill_3d=True).sum() == 32 * 3
    assert reference_body(np.moveaxis(v, -1, 0), axial_axis=0).sum() == 36 * 3
