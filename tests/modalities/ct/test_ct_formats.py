"""CT sources other than .npy: NIfTI and NRRD give the same records as the same array in a .npy,
keep the header's geometry (index, inspect, loader), reorient like nibabel, resample by real
spacing, and refuse bad files clearly. DICOM series: tests/modalities/ct/test_ct_formats_dicom.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.errors import ManifestError, SourceError
from pipeline.modalities.ct.demo import make_chest_volume
from pipeline.modalities.ct.kind import settings_from_json, settings_json
from pipeline.modalities.ct.settings import CtSettings
from pipeline.modalities.ct.volume import prepare_grid, process_array, process_volume
from pipeline.modalities.ct.writers import chest_affine, write_nifti, write_nrrd
from pipeline.source import get_source
from pipeline.verify import format_summary, summary, verify

nib = pytest.importorskip("nibabel")
pytest.importorskip("nrrd")
REPO = Path(__file__).resolve().parents[3]
AFFINE = chest_affine((0.7, 0.8, 2.5), (10.0, 20.0, -30.0))  # LPS-stored, as scanners give it


def records(root: Path) -> dict[str, dict[str, Any]]:
    """file name -> its record's metadata in index.json."""
    by_shard = fmt.read_index(root).section("ct")["records"]
    return {r["file"]: r for rs in by_shard.values() for r in rs}


@pytest.fixture(scope="module")
def chest() -> np.ndarray:
    return make_chest_volume((48, 44, 20), 3)[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, chest: np.ndarray) -> Path:
    """The same array as .npy and in every NIfTI/NRRD flavour (compressed or not, attached or
    detached)."""
    d = tmp_path_factory.mktemp("ct-formats") / "v"
    d.mkdir()
    np.save(d / "a.npy", chest)
    write_nifti(d / "b.nii", chest, AFFINE)
    write_nifti(d / "c.nii.gz", chest, AFFINE)
    write_nrrd(d / "d.nrrd", chest, AFFINE)
    write_nrrd(d / "e.nrrd", chest, AFFINE, encoding="raw")
    write_nrrd(d / "f.nhdr", chest, AFFINE)
    write_nrrd(d / "g.nhdr", chest, AFFINE, encoding="raw")
    return d


ALL = [
    'path = "v/*.npy"',
    'path = "v/*.nii*"\ntype = "nifti"',
    'path = "v/*.nrrd"',
    'path = "v/*.nhdr"',
]
OTHERS = ("b.nii", "c.nii.gz", "d.nrrd", "e.nrrd", "f.nhdr", "g.nhdr")


@pytest.fixture(scope="module")
def built(files: Path, ct: Any) -> Path:
    root = files.parent
    build(ct.manifest(root, ALL, cap=1500), root / "out", jobs=2, progress=False)
    return root / "out"


def test_same_array_same_records_in_every_format(ct: Any, built: Path) -> None:
    """The keep rule and the content-seeded cap give the very same points and features, whatever
    file holds the array: the readers return the .npy's array, axis for axis (a reader that
    transposed, flipped or scaled would fail here)."""
    got = ct.served(built)
    assert sorted(got) == sorted(["a.npy", *OTHERS])
    ref = got["a.npy"]
    assert ref["coords"].shape[0] == 1500  # capped: the subset is drawn from the content
    for name in OTHERS:
        np.testing.assert_array_equal(got[name]["coords"], ref["coords"], err_msg=name)
        np.testing.assert_array_equal(got[name]["feats"], ref["feats"], err_msg=name)
    recs = records(built)
    assert {recs[n]["kept"] for n in recs} == {recs["a.npy"]["kept"]}
    assert {recs[n]["format"] for n in OTHERS} == {"nifti", "nrrd"}
    assert recs["a.npy"]["format"] == "npy"
    assert verify(built) == []


def test_geometry_is_kept_in_the_index_and_inspect(built: Path) -> None:
    recs = records(built)
    for name in OTHERS:
        r = recs[name]
        assert r["spacing"] == pytest.approx([0.7, 0.8, 2.5])
        assert r["origin"] == pytest.approx([10, 20, -30])
        np.testing.assert_allclose(r["direction"], np.diag([-1.0, -1.0, 1.0]), atol=1e-12)
        assert r["space"] == "RAS" and r["axes"] == "LPS", name
    assert recs["a.npy"]["direction"] is None and recs["a.npy"]["spacing"] is None
    text = format_summary(summary(built))
    assert "sources by format: nifti 2, npy 1, nrrd 4" in text
    assert (
        "c.nii.gz (nifti): shape [48, 44, 20], axes LPS, spacing [0.7, 0.8, 2.5] mm, "
        "origin [10, 20, -30]"
    ) in text


def test_scl_slope_and_inter_give_the_same_hu(tmp_path: Path, chest: np.ndarray) -> None:
    """NIfTI stored as uint16 with scl_inter = -1024 (as DICOM converters write it) and as int16
    with scl_slope = 0.5: HU = stored * slope + inter, slab by slab, so the records are those of the
    HU array itself (exact integers; the halves rounded as a float .npy is)."""
    for name, stored, slope, inter in (
        ("u.nii", (chest + 1024).astype(np.uint16), 1.0, -1024.0),
        ("h.nii.gz", (chest * 2).astype(np.int16), 0.5, 0.0),
    ):
        img = nib.Nifti1Image(stored, AFFINE)
        img.header.set_slope_inter(slope, inter)
        nib.save(img, tmp_path / name)
        src = get_source("nifti")(tmp_path / name)
        h = src.header()
        o = src.open(h)
        assert h.dtype == stored.dtype.str and h.facts["inter"] == inter
        rec = process_array(
            o.array, src.path, CtSettings(max_points=None), 0, h.shape, h.dtype, o.geometry
        )
        np.save(tmp_path / "a.npy", chest)
        ref = process_volume(tmp_path / "a.npy", CtSettings(max_points=None))
        np.testing.assert_array_equal(rec.coords, ref.coords, err_msg=name)
        np.testing.assert_array_equal(rec.features["hu"], ref.features["hu"], err_msg=name)


def test_loader_returns_each_volumes_affine_through_crops_and_flips(ct: Any, built: Path) -> None:
    """geometry=True: ``affine @ (x, y, z, 1)`` of a served point is its position in mm, the same
    point whether the volume was cropped and flipped or not (a wrong shift or flip sign moves every
    point)."""
    plain = ct.served(built, geometry=True)
    np.testing.assert_allclose(plain["c.nii.gz"]["affine"], AFFINE)
    np.testing.assert_allclose(plain["d.nrrd"]["spacing"], [0.7, 0.8, 2.5])
    assert np.isnan(plain["a.npy"]["affine"]).all()  # a bare .npy: no spacing, no world position
    aug = ct.served(built, geometry=True, crop=(30, 25, 12), flip=True, seed=2)
    for name in OTHERS:

        def mm(d: dict[str, np.ndarray]) -> np.ndarray:
            x = np.c_[d["coords"].astype(np.float64), np.ones(len(d["coords"]))]
            return (x @ d["affine"].T)[:, :3]

        world = {tuple(np.round(p, 6)) for p in mm(plain[name])}
        got = mm(aug[name])
        assert 0 < len(got) < len(world)
        assert {tuple(np.round(p, 6)) for p in got} <= world, name
    assert "affine" not in ct.served(built)["c.nii.gz"]  # off by default


def test_orientation_matches_nibabel_as_closest_canonical(
    tmp_path: Path, chest: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    """A volume stored with its axes permuted and flipped (slices first, as a stack would be):
    orientation = "RAS" gives nibabel's as_closest_canonical array and affine, and axis 2 is then
    the axial one, so the body mask fills the right slices: the records equal those of the
    canonical array saved as .npy."""
    odd = np.ascontiguousarray(np.flip(np.transpose(chest, (2, 0, 1)), axis=1))  # axes (S, R, P)
    aff = np.zeros((4, 4))
    aff[0, 1], aff[1, 2], aff[2, 0], aff[3, 3] = 0.7, -0.8, 2.5, 1.0
    aff[:3, 3] = (-20.0, 5.0, -40.0)
    write_nifti(tmp_path / "odd.nii.gz", odd, aff)
    canon = nib.as_closest_canonical(nib.load(tmp_path / "odd.nii.gz"))
    ras = np.asarray(canon.dataobj)
    for target, frame in (("RAS", ras), ("LPS", np.flip(ras, (0, 1)))):
        s = CtSettings.from_section({"orientation": target, "max_points": 0})
        src = get_source("nifti")(tmp_path / "odd.nii.gz")
        h = src.header()
        o = src.open(h)
        rec = process_array(o.array, src.path, s, 0, h.shape, h.dtype, o.geometry)
        np.save(tmp_path / f"{target}.npy", np.ascontiguousarray(frame))
        ref = process_volume(tmp_path / f"{target}.npy", CtSettings(max_points=None))
        np.testing.assert_array_equal(rec.coords, ref.coords)
        np.testing.assert_array_equal(rec.features["hu"], ref.features["hu"])
        assert rec.geometry.axcodes() == target
        if target == "RAS":
            np.testing.assert_allclose(rec.geometry.affine(), canon.affine)
    with caplog.at_level(logging.WARNING, logger="pipeline.modalities.ct.volume"):
        stored = process_array(
            o.array, src.path, CtSettings(max_points=None), 0, h.shape, h.dtype, o.geometry
        )
    assert stored.geometry.axcodes() == "SRP" and stored.shape == odd.shape  # default: as stored
    assert (
        "odd.nii.gz: its axis 0 runs head to foot (axes SRP), but [ct] axial_axis = -1"
        in caplog.text
    )  # the mask would fill sagittal slices: said, not silently done
    with pytest.raises(SourceError, match=r"a\.npy: orientation = 'RAS' needs the volume's "):
        np.save(tmp_path / "a.npy", chest)
        process_volume(tmp_path / "a.npy", CtSettings(orientation="RAS"))


def test_spacing_mm_resamples_by_real_spacing_like_torch(tmp_path: Path, chest: np.ndarray) -> None:
    """spacing_mm = 1.0: the grid torch's interpolate(scale_factor=spacing,
    recompute_scale_factor=False) gives, spacing 1 mm on every axis, the origin moved to the new
    voxel 0's centre."""
    torch = pytest.importorskip("torch")
    write_nrrd(tmp_path / "v.nrrd", chest, AFFINE)
    src = get_source("nrrd")(tmp_path / "v.nrrd")
    h = src.header()
    o = src.open(h)
    s = CtSettings.from_section({"spacing_mm": 1.0, "max_points": 0})
    grid, geometry, clipped = prepare_grid(o.array, src.path, s, o.geometry)
    sp = (0.7, 0.8, 2.5)
    ref = torch.nn.functional.interpolate(
        torch.from_numpy(chest.astype(np.float32))[None, None],
        scale_factor=sp,
        mode="trilinear",
        align_corners=False,
        recompute_scale_factor=False,
    )[0, 0].numpy()
    assert grid.shape == ref.shape == (33, 35, 50) and clipped == 0
    assert np.abs(grid.astype(np.float32) - np.rint(ref)).max() <= 1  # float32 summation order
    assert geometry.spacing == pytest.approx((1.0, 1.0, 1.0))
    shift = np.array([0.5 / p - 0.5 for p in sp])  # in input voxels: half an output one - half one
    np.testing.assert_allclose(geometry.origin, AFFINE[:3, 3] + AFFINE[:3, :3] @ shift)
    rec = process_array(o.array, src.path, s, 0, h.shape, h.dtype, o.geometry)
    assert rec.shape == grid.shape and rec.geometry == geometry
    np.save(tmp_path / "bare.npy", chest)
    with pytest.raises(SourceError, match=r"bare\.npy: \[ct\] spacing_mm = 1 needs the volume's"):
        process_volume(tmp_path / "bare.npy", s)


def test_settings_keys_validate() -> None:
    s = CtSettings.from_section({"orientation": "LPS", "spacing_mm": 0.8})
    assert (s.orientation, s.spacing_mm) == ("LPS", 0.8)
    assert settings_from_json(settings_json(s)) == s
    assert "orientation" not in settings_json(CtSettings())  # .npy-only builds' settings as before
    for section, key in (
        ({"orientation": "ras"}, "ct.orientation"),
        ({"spacing_mm": -1}, "ct.spacing_mm"),
        ({"spacing_mm": 1, "resolution": 64}, "ct.spacing_mm"),
        ({"orientation": "RAS", "axial_axis": 0}, "ct.axial_axis"),
    ):
        with pytest.raises(ManifestError, match=rf"\[{key}\]"):
            CtSettings.from_section(section, "m.toml")


def test_an_nhdr_data_file_change_is_seen_by_the_no_change_check(
    ct: Any, tmp_path: Path, chest: np.ndarray
) -> None:
    """The voxels of an .nhdr live in its data file: editing only that file must rebuild, not be
    taken for 'nothing changed' (the header's size and mtime are the same)."""
    (tmp_path / "v").mkdir()
    write_nrrd(tmp_path / "v" / "h.nhdr", chest, AFFINE, encoding="raw")
    m = ct.manifest(tmp_path, ['path = "v/*.nhdr"'])
    build(m, tmp_path / "out", progress=False)
    first = ct.served(tmp_path / "out")["h.nhdr"]["feats"]
    assert not build(m, tmp_path / "out", progress=False).changed
    raw = tmp_path / "v" / "h.raw"
    data = np.fromfile(raw, np.int16)
    data[data == -850] = -700  # every lung voxel shifts by 150 HU
    data.tofile(raw)
    assert build(m, tmp_path / "out", progress=False).changed
    assert not np.array_equal(ct.served(tmp_path / "out")["h.nhdr"]["feats"], first)


def test_nifti_example_manifest_builds(tmp_path: Path, chest: np.ndarray) -> None:
    """data_manifests/examples/ct_nifti.toml, pointed at two NIfTI volumes: orientation RAS and 1 mm
    isotropic voxels, geometry in the index."""
    text = (REPO / "data_manifests" / "examples" / "ct_nifti.toml").read_text()
    assert 'path = "/data/msd_lung/imagesTr/*.nii.gz"' in text
    (tmp_path / "imagesTr").mkdir()
    for i in range(2):
        write_nifti(
            tmp_path / "imagesTr" / f"lung_{i:03d}.nii.gz", np.roll(chest, 3 * i, axis=0), AFFINE
        )
    (tmp_path / "ex.toml").write_text(text.replace("/data/msd_lung", str(tmp_path)))
    out = build(tmp_path / "ex.toml", tmp_path / "out", jobs=2, progress=False).out
    recs = [r for rs in fmt.read_index(out).section("ct")["records"].values() for r in rs]
    assert len(recs) == 2 and all(r["axes"] == "RAS" for r in recs)
    assert all(r["spacing"] == pytest.approx([1.0, 1.0, 1.0]) for r in recs)


def test_memory_bound_by_format(tmp_path: Path) -> None:
    """docs/CT.md's bound per format (tracemalloc: numpy's working set): a .nii and a raw NRRD are
    memory- mapped like a .npy (<= 1.5 x the grid's int16 bytes + 24 MiB + 10 bytes a point); a
    .nii.gz and a DICOM series hold the volume in memory once more in int16 (+1 x), never as
    floats."""
    import tracemalloc

    from pipeline.modalities.ct.demo import write_large_chest
    from pipeline.modalities.ct.writers import write_dicom_series

    shape = (384, 384, 128)
    hu = np.load(write_large_chest(tmp_path / "m.npy", shape, 2))
    files = {
        "nifti": (write_nifti(tmp_path / "a.nii", hu, AFFINE), 1.5),
        "nrrd": (write_nrrd(tmp_path / "b.nrrd", hu, AFFINE, encoding="raw"), 1.5),
        "nifti.gz": (write_nifti(tmp_path / "c.nii.gz", hu, AFFINE), 2.5),
        "dicom": (write_dicom_series(tmp_path / "d", hu, AFFINE), 2.5),
    }
    del hu
    volume_i16 = int(np.prod(shape)) * 2
    for typ, (path, bound) in files.items():
        tracemalloc.start()
        try:
            src = get_source(typ.split(".")[0])(path)
            h = src.header()
            o = src.open(h)
            rec = process_array(
                o.array, path, CtSettings(max_points=None), 0, h.shape, h.dtype, o.geometry
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        del o
        assert peak - rec.points * 10 < bound * volume_i16 + 24 * 2**20, (typ, peak / volume_i16)
