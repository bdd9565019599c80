"""Per-volume CT processing (pipeline.modalities.ct.volume, pipeline.modalities.ct.mask) against the
independent reference."""

from __future__ import annotations

import io
import json
import re
import shutil
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.errors import ManifestError, SourceError
from pipeline.modalities.ct.demo import (
    DEMO_VOLUMES,
    make_chest_volume,
    write_ct_demo,
    write_large_chest,
)
from pipeline.modalities.ct.kind import settings_from_json, settings_json
from pipeline.modalities.ct.mask import resample
from pipeline.modalities.ct.volume import CtSettings, inspect_volume, process_volume


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_ct_demo(tmp_path_factory.mktemp("ct"))


def save(path: Path, a: np.ndarray) -> Path:
    np.save(path, a, allow_pickle=False)
    return path


def check_equal(rec, ref) -> None:  # noqa: ANN001
    coords, hu, window = ref
    np.testing.assert_array_equal(rec.coords, coords)
    assert rec.coords.dtype == np.uint16
    if "hu" in rec.features:
        np.testing.assert_array_equal(rec.features["hu"], hu)
        assert rec.features["hu"].dtype == np.int16
    if "window" in rec.features:
        np.testing.assert_array_equal(rec.features["window"], window)
        assert rec.features["window"].dtype == np.float16


SETTINGS = [
    ({}, {}),
    ({"band": []}, {"band": None}),
    ({"body_mask": False}, {"body": False}),
    ({"window": "bone", "band": False}, {"level": 400, "width": 1800, "band": None}),
    (
        {"window": {"level": -500, "width": 1001}, "band": [-950.5, -600.2]},
        {"level": -500, "width": 1001, "band": (-950.5, -600.2)},
    ),
    ({"features": ["window"], "body_threshold": -300}, {"threshold": -300}),
]


@pytest.mark.parametrize(("section", "ref_kw"), SETTINGS)
def test_records_equal_the_reference(
    demo: list[Path], section: dict, ref_kw: dict, reference_points: Callable[..., Any]
) -> None:
    s = CtSettings.from_section({**section, "max_points": 0})
    for p in demo:
        check_equal(process_volume(p, s), reference_points(np.load(p), **ref_kw))


def test_axial_axis_zero_and_fortran_order(
    tmp_path: Path, reference_points: Callable[..., Any]
) -> None:
    hu, _ = make_chest_volume((40, 36, 16), 5)
    stack = np.ascontiguousarray(np.moveaxis(hu, -1, 0))  # DICOM-style: slices first
    s = CtSettings.from_section({"axial_axis": 0, "max_points": 0})
    check_equal(
        process_volume(save(tmp_path / "a.npy", stack), s), reference_points(stack, axial_axis=0)
    )
    check_equal(
        process_volume(save(tmp_path / "f.npy", np.asfortranarray(stack)), s),
        reference_points(stack, axial_axis=0),
    )


def test_defaults_keep_the_lungs_and_a_3d_fill_would_not(
    demo: list[Path], reference_points: Callable[..., Any]
) -> None:
    for p, spec in zip(demo, DEMO_VOLUMES, strict=True):
        rec = process_volume(p, CtSettings())
        hu, lungs = make_chest_volume(spec.shape, spec.seed)
        kept = np.zeros(spec.shape, dtype=bool)
        kept[tuple(rec.coords.T.astype(np.int64))] = True
        assert (kept & lungs).sum() > 0.95 * lungs.sum()
        assert (kept & lungs).sum() > 0.95 * kept.sum()
        assert rec.points < 0.1 * rec.voxels  # genuinely sparse
        three_d = reference_points(hu, fill_3d=True)[0]
        assert len(three_d) < 0.1 * rec.points  # the pitfall is present in the demo data


def test_float_and_other_integer_dtypes_are_converted(
    tmp_path: Path, reference_points: Callable[..., Any]
) -> None:
    hu, _ = make_chest_volume((32, 32, 12), 3)
    ref = reference_points(hu)
    noisy = hu.astype(np.float32) + np.float32(0.3)  # rounds back to hu
    check_equal(process_volume(save(tmp_path / "f.npy", noisy), CtSettings()), ref)
    check_equal(process_volume(save(tmp_path / "i.npy", hu.astype(">i4")), CtSettings()), ref)
    big = hu.astype(np.int32)
    big[0, 0, 0] = 40000
    rec = process_volume(save(tmp_path / "b.npy", big), CtSettings())
    assert rec.clipped == 1 and rec.source_dtype == "<i4"


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_float_volume_names_file_and_voxel(tmp_path: Path, bad: float) -> None:
    v = np.zeros((4, 5, 6), dtype=np.float64)
    v[2, 3, 4] = bad
    with pytest.raises(
        SourceError, match=r"nan\.npy.*non-finite.*\(2, 3, 4\)" if bad != bad else r"\(2, 3, 4\)"
    ):
        process_volume(save(tmp_path / "nan.npy", v), CtSettings(body_mask=False))


def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    obj = tmp_path / "obj.npy"
    np.save(obj, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(SourceError, match=r"obj\.npy: dtype object holds Python objects"):
        inspect_volume(obj)
    with pytest.raises(SourceError, match=r"flat\.npy: expected a 3-D volume, got a 2-D"):
        inspect_volume(save(tmp_path / "flat.npy", np.zeros((4, 4), np.int16)))
    with pytest.raises(SourceError, match="not an integer or float"):
        inspect_volume(save(tmp_path / "rec.npy", np.zeros((2, 2, 2), dtype=[("a", "i2")])))
    buf = io.BytesIO()
    np.save(buf, np.zeros((8, 8, 8), np.int16))
    (tmp_path / "cut.npy").write_bytes(buf.getvalue()[:-10])
    with pytest.raises(SourceError, match=r"cut\.npy: truncated \.npy"):
        process_volume(tmp_path / "cut.npy", CtSettings())
    (tmp_path / "junk.npy").write_bytes(b"not a numpy file at all")
    with pytest.raises(SourceError, match=r"junk\.npy: not a \.npy file"):
        inspect_volume(tmp_path / "junk.npy")
    (tmp_path / "half.npy").write_bytes(buf.getvalue()[:20])
    with pytest.raises(SourceError, match=r"half\.npy: corrupt \.npy header"):
        inspect_volume(tmp_path / "half.npy")
    with pytest.raises(SourceError, match="cannot read"):
        inspect_volume(tmp_path / "missing.npy")


def test_sidecar(tmp_path: Path) -> None:
    p = save(tmp_path / "v.npy", np.zeros((4, 4, 4), np.int16))
    assert inspect_volume(p).spacing is None
    (tmp_path / "v.json").write_text(json.dumps({"spacing": [0.5, 0.5, 2], "origin": [1, 2, 3]}))
    info = inspect_volume(p)
    assert info.spacing == (0.5, 0.5, 2.0) and info.origin == (1.0, 2.0, 3.0)
    for doc, msg in (
        ({"spacing": [1, 2]}, "3 finite numbers"),
        ({"spacing": [1, 0, 1]}, "positive"),
        ([1, 2, 3], "JSON object"),
    ):
        (tmp_path / "v.json").write_text(json.dumps(doc))
        with pytest.raises(SourceError, match=rf"v\.json: .*{msg}"):
            inspect_volume(p)
    (tmp_path / "v.json").write_text("{nope")
    with pytest.raises(SourceError, match=r"v\.json: sidecar is not valid JSON"):
        inspect_volume(p)


def test_max_points_subsample_is_deterministic_and_in_order(demo: list[Path]) -> None:
    full = process_volume(demo[2], CtSettings(max_points=None))
    s = CtSettings(max_points=1000)
    a, b = process_volume(demo[2], s, seed=7), process_volume(demo[2], s, seed=7)
    c = process_volume(demo[2], s, seed=8)
    assert a.points == 1000 and a.kept == full.points
    np.testing.assert_array_equal(a.coords, b.coords)
    np.testing.assert_array_equal(a.features["hu"], b.features["hu"])
    assert not np.array_equal(a.coords, c.coords)
    flat = lambda r: np.ravel_multi_index(r.coords.T.astype(np.int64), r.shape)  # noqa: E731
    assert np.all(np.diff(flat(a)) > 0)  # argwhere order kept
    pos = np.searchsorted(flat(full), flat(a))
    np.testing.assert_array_equal(
        full.coords[pos], a.coords
    )  # a subset of the full record, features aligned
    np.testing.assert_array_equal(full.features["window"][pos], a.features["window"])
    renamed = Path(
        shutil.copy(demo[2], demo[2].parent / "renamed_copy.npy")
    )  # seeded by content, not name
    try:
        np.testing.assert_array_equal(process_volume(renamed, s, seed=7).coords, a.coords)
    finally:
        renamed.unlink()
    full1 = process_volume(demo[1], CtSettings(max_points=None))
    other = process_volume(
        demo[1], s, seed=7
    )  # another volume, same seed: another draw of positions
    assert not np.array_equal(np.searchsorted(flat(full1), flat(other)), pos)


def test_min_points_and_empty_mask_give_skip_reasons(tmp_path: Path, demo: list[Path]) -> None:
    rec = process_volume(demo[0], CtSettings(min_points=10**6))
    assert "< min_points = 1000000" in (rec.skip_reason(CtSettings(min_points=10**6)) or "")
    assert rec.skip_reason(CtSettings()) is None
    air = process_volume(
        save(tmp_path / "air.npy", np.full((8, 8, 8), -1000, np.int16)), CtSettings()
    )
    assert air.points == 0 and air.body_voxels == 0
    assert "empty body mask" in (air.skip_reason(CtSettings()) or "")


def test_resample_matches_torch_trilinear(
    tmp_path: Path, reference_points: Callable[..., Any]
) -> None:
    torch = pytest.importorskip("torch")
    hu, _ = make_chest_volume((48, 40, 20), 9)
    for res in (24, 70):
        out, clipped, spacing, origin = resample(
            hu, res, tmp_path / "x.npy", (1.0, 2.0, 3.0), (0.0, 0.0, 0.0)
        )
        expect_shape = tuple(int(round(n * res / 48)) for n in hu.shape)
        ref = torch.nn.functional.interpolate(
            torch.from_numpy(hu.astype(np.float32))[None, None],
            size=expect_shape,
            mode="trilinear",
            align_corners=False,
        )[0, 0].numpy()
        assert out.shape == expect_shape and clipped == 0
        assert (
            np.abs(out.astype(np.float32) - np.rint(ref)).max() <= 1
        )  # float32 summation order may differ
        assert spacing == pytest.approx(
            tuple(s * n / m for s, n, m in zip((1, 2, 3), hu.shape, out.shape, strict=True))
        )
        assert origin is not None
    p = save(tmp_path / "r.npy", hu)
    rec = process_volume(p, CtSettings(resolution=24, max_points=None))
    small = resample(hu, 24, p, None, None)[0]
    check_equal(rec, reference_points(small))
    assert rec.shape == small.shape and rec.source_shape == hu.shape


def test_memory_bound(tmp_path: Path) -> None:
    """Working set <= 1.5 x the volume's int16 bytes + 24 MiB of slab temporaries + 10 bytes a
    stored point (docs/CT.md): the bool mask (0.5 x) and uint16 labels (1 x) span the volume,
    nothing else does."""
    shape = (384, 384, 128)
    p = write_large_chest(tmp_path / "m.npy", shape, 2)
    tracemalloc.start()
    try:
        rec = process_volume(p, CtSettings(max_points=None))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    volume_i16 = int(np.prod(shape)) * 2
    assert peak - rec.points * 10 < 1.5 * volume_i16 + 24 * 2**20, (peak, volume_i16)
    assert peak > volume_i16  # the measurement sees numpy's memory (the label array is in it)


def test_many_components_fall_back_to_int32_labels(
    tmp_path: Path, reference_points: Callable[..., Any]
) -> None:
    v = np.full((128, 128, 64), -1000, dtype=np.int16)
    v[::2, ::2, ::2] = 0  # 79872 isolated specks of tissue outside the block below
    v[20:100, 20:100, :] = 0
    v[40:60, 40:60, 5:35] = -700  # a hole inside the block, kept by the band
    from scipy import ndimage

    assert ndimage.label(v > -500)[1] > 65535
    check_equal(
        process_volume(save(tmp_path / "s.npy", v), CtSettings(max_points=None)),
        reference_points(v),
    )


def test_settings_validate_and_round_trip() -> None:
    s = CtSettings.from_section(
        {
            "window": "mediastinum",
            "band": [-100, 100],
            "resolution": 256,
            "max_points": 0,
            "features": ["window"],
            "axial_axis": 0,
        }
    )
    assert (s.level, s.width, s.max_points, s.resolution) == (40, 400, None, 256)
    assert settings_from_json(json.loads(json.dumps(settings_json(s)))) == s
    assert CtSettings.from_section({}) == CtSettings()
    assert CtSettings().hu_bounds() == (-1000, -400)
    for section, key in (
        ({"window": "liver"}, "ct.window"),
        ({"window": {"level": 1}}, "ct.window"),
        ({"window": {"level": 0, "width": 0}}, "ct.window.width"),
        ({"band": [1]}, "ct.band"),
        ({"band": [100, -100]}, "ct.band"),
        ({"band": [500, 600]}, "ct.band"),
        ({"features": ["hu", "hu"]}, "ct.features"),
        ({"features": ["rgb"]}, "ct.features"),
        ({"axial_axis": 3}, "ct.axial_axis"),
        ({"min_points": -1}, "ct.min_points"),
        ({"max_points": 10, "min_points": 100}, "ct.max_points"),
        ({"resolution": 1}, "ct.resolution"),
        ({"body_mask": "yes"}, "ct.body_mask"),
        ({"windw": "lung"}, "ct.windw"),
    ):
        with pytest.raises(ManifestError, match=r"m\.toml: \[" + re.escape(key) + r"\]"):
            CtSettings.from_section(section, "m.toml")
