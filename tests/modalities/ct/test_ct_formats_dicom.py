"""DICOM series as CT sources (type = "dicom"): slices ordered by position, not name; HU from the
rescale tags; geometry in RAS; one series a folder; every broken series refused naming it, or
counted."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.errors import SourceError
from pipeline.modalities.ct.demo import make_chest_volume
from pipeline.modalities.ct.settings import CtSettings
from pipeline.modalities.ct.volume import process_array, process_volume
from pipeline.modalities.ct.writers import chest_affine, write_dicom_series
from pipeline.source import get_source

pydicom = pytest.importorskip("pydicom")
REPO = Path(__file__).resolve().parents[3]
AFFINE = chest_affine((0.7, 0.8, 2.5), (10.0, 20.0, -30.0))
DATA = Path(pydicom.__file__).parent / "data" / "test_files"  # real scanner files pydicom ships


@pytest.fixture(scope="module")
def chest() -> np.ndarray:
    return make_chest_volume((40, 36, 16), 7)[0]


def read(folder: Path, settings: CtSettings | None = None, **options: object):  # noqa: ANN201
    src = get_source("dicom")(folder, **options)
    h = src.header()
    o = src.open(h)
    s = settings or CtSettings(max_points=None)
    return process_array(o.array, folder, s, 0, h.shape, h.dtype, o.geometry, o.clipped), o


def test_a_series_reads_as_the_array_it_was_written_from(tmp_path: Path, chest: np.ndarray) -> None:
    """File names are shuffled: only sorting by ImagePositionPatient along the normal gives the
    array back (sorting by name would scramble the slices). HU = stored * slope + intercept;
    geometry from the tags."""
    folder = write_dicom_series(tmp_path / "s", chest, AFFINE, seed=5)
    names = sorted(p.name for p in folder.iterdir())
    by_name = [
        int(pydicom.dcmread(folder / n, stop_before_pixels=True).InstanceNumber) for n in names
    ]
    assert by_name != sorted(by_name)  # name order is not slice order
    rec, opened = read(folder)
    np.testing.assert_array_equal(opened.array, chest)
    np.save(tmp_path / "a.npy", chest)
    ref = process_volume(tmp_path / "a.npy", CtSettings(max_points=None))
    np.testing.assert_array_equal(rec.coords, ref.coords)
    np.testing.assert_array_equal(rec.features["window"], ref.features["window"])
    np.testing.assert_allclose(rec.geometry.affine(), AFFINE, atol=1e-6)
    assert rec.geometry.axcodes() == "LPS" and rec.source_dtype == "<i2"


def test_slices_written_head_first_and_fractional_rescale(
    tmp_path: Path, chest: np.ndarray
) -> None:
    """Positions decreasing along the normal (axis 2 pointing Inferior) and a slope of 0.5: still
    the written array, the affine's third column pointing down; HU rounded as the .npy path rounds
    floats."""
    flipped = chest_affine((0.7, 0.8, 2.5), (10.0, 20.0, 10.0), axes="LPI")
    folder = write_dicom_series(
        tmp_path / "s", chest, flipped, seed=1, slope=0.5, intercept=-1000.0
    )
    rec, opened = read(folder)
    assert rec.geometry.axcodes() == "LPS"  # sorted along the normal: stored ascending
    np.testing.assert_array_equal(opened.array, chest[:, :, ::-1])
    last = flipped[:3, :3] @ [0, 0, 15] + flipped[:3, 3]  # the slice written last comes first
    np.testing.assert_allclose(rec.geometry.affine()[:3, 3], last)


def test_rle_compressed_series_decodes(tmp_path: Path, chest: np.ndarray) -> None:
    from pydicom.uid import RLELossless

    folder = write_dicom_series(tmp_path / "s", chest, AFFINE, seed=2, syntax=RLELossless)
    assert pydicom.dcmread(next(folder.iterdir())).file_meta.TransferSyntaxUID == RLELossless
    np.testing.assert_array_equal(read(folder)[1].array, chest)


def test_several_series_are_listed_and_series_picks_one(tmp_path: Path, chest: np.ndarray) -> None:
    a = write_dicom_series(tmp_path / "a", chest, AFFINE, seed=1, series_uid="1.2.3.4.1")
    b = write_dicom_series(tmp_path / "b", chest[::-1], AFFINE, seed=2, series_uid="1.2.3.4.2")
    for p in b.iterdir():
        shutil.move(p, a / f"b_{p.name}")
    with pytest.raises(
        SourceError,
        match=r"/a: the folder holds 2 series: 1\.2\.3\.4\.1 \(CT, "
        r"16 files, "
        r"'demo chest'\); 1\.2\.3\.4\.2 .* set series = ",
    ):
        get_source("dicom")(a).header()
    np.testing.assert_array_equal(read(a, series="1.2.3.4.2")[1].array, chest[::-1])
    with pytest.raises(
        SourceError,
        match=r"series = '9\.9' is not in this folder; it holds "
        r"1\.2\.3\.4\.1",
    ):
        get_source("dicom")(a, series="9.9").header()


def _gap(d: Path, v: np.ndarray) -> Path:
    kept = [k for k in range(v.shape[2]) if k not in (7, 8)]
    return write_dicom_series(d, v, AFFINE, positions=kept)


def _time(d: Path, v: np.ndarray) -> Path:
    write_dicom_series(d, v, AFFINE, seed=1, series_uid="1.2.9")
    write_dicom_series(d.with_name("t2"), v, AFFINE, seed=2, series_uid="1.2.9")
    for p in d.with_name("t2").iterdir():
        shutil.move(p, d / f"t2_{p.name}")
    return d


def _mixed(d: Path, v: np.ndarray) -> Path:
    write_dicom_series(d, v, AFFINE, series_uid="1.2.8")
    scout = write_dicom_series(d.with_name("scout"), v[:20, :20, :1], AFFINE, series_uid="1.2.8")
    shutil.move(next(scout.iterdir()), d / "scout.dcm")
    return d


def _jpeg(d: Path, v: np.ndarray) -> Path:
    from pydicom.pixels import get_decoder
    from pydicom.uid import JPEGLosslessSV1

    if get_decoder(JPEGLosslessSV1).is_available:
        pytest.skip("a JPEG Lossless decoder plug-in is installed here")
    return write_dicom_series(d, v, AFFINE, syntax=JPEGLosslessSV1)


def _one_slice(d: Path, v: np.ndarray) -> Path:
    d.mkdir()
    shutil.copy(DATA / "CT_small.dcm", d / "CT_small.dcm")  # a real CT slice (pydicom's test data)
    return d


BAD = {
    "gap": (
        _gap,
        r"missing slices: a gap of 7\.500 mm between .* \(median spacing 2\.500 mm; "
        r"about 2 slices",
    ),
    "time": (_time, r"32 slices at only 16 positions .* a 4-D series"),
    "mixed": (
        _mixed,
        r"mixed slice sizes: 36x40 \(16 files\), 20x20 \(1 files\) "
        r"\(e\.g\. scout\.dcm\)",
    ),
    "jpeg": (
        _jpeg,
        r"IM\d+\.dcm: compressed transfer syntax JPEG Lossless.* no decoder plug-in "
        r".* pip install pylibjpeg",
    ),
    "one_slice": (_one_slice, r"a 2-D image of shape \(128, 128, 1\)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_broken_series_are_refused_before_any_voxel_is_read(
    tmp_path: Path, chest: np.ndarray, case: str
) -> None:
    make, msg = BAD[case]
    if case == "one_slice" and not (DATA / "CT_small.dcm").exists():
        pytest.skip("pydicom's test data is not installed")
    folder = make(tmp_path / case, chest)
    with pytest.raises(SourceError, match=msg):
        get_source("dicom")(folder).header()


@pytest.mark.process
def test_cli_refuses_a_gap_naming_the_folder_without_a_traceback(
    ct: Any, tmp_path: Path, chest: np.ndarray
) -> None:
    _gap(tmp_path / "series" / "gappy", chest)
    m = ct.manifest(tmp_path, ['path = "series"\ntype = "dicom"'])
    r = ct.cli_build(m, tmp_path / "out")
    assert r.returncode == 2 and "gappy: missing slices" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "index.json").exists()


@pytest.mark.process
def test_a_cut_slice_file_fails_the_pack_naming_it(
    ct: Any, tmp_path: Path, chest: np.ndarray
) -> None:
    folder = write_dicom_series(tmp_path / "v" / "s", chest, AFFINE)
    victim = sorted(folder.iterdir())[3]
    victim.write_bytes(victim.read_bytes()[:-500])
    m = ct.manifest(tmp_path, ['path = "v"\ntype = "dicom"'])
    with pytest.raises(SourceError, match=rf"{victim.name}: cannot decode the pixels"):
        build(m, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "index.json").exists()
    r = ct.cli_build(m, tmp_path / "out")
    assert r.returncode == 2 and f"{victim.name}: cannot decode" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_tree_of_series_builds_skipping_non_ct_and_non_images(
    ct: Any, tmp_path: Path, chest: np.ndarray
) -> None:
    """``path`` a folder of patients: every series folder below it is a source (sorted); an MR
    series (a real pydicom file) is skipped and counted, an XML annotation beside the slices is
    passed over, and the records equal the .npy's; editing one slice rebuilds (the folder's files
    are its fingerprint)."""
    write_dicom_series(tmp_path / "pts" / "p1" / "ct_a", chest, AFFINE, seed=3)
    (tmp_path / "pts" / "p1" / "ct_a" / "069.xml").write_text("<LidcReadMessage/>")
    write_dicom_series(tmp_path / "pts" / "p2" / "ct_b", chest[:, ::-1], AFFINE, seed=4)
    mr = (DATA / "MR_small.dcm").exists()
    if mr:
        (tmp_path / "pts" / "p2" / "mr").mkdir()
        shutil.copy(DATA / "MR_small.dcm", tmp_path / "pts" / "p2" / "mr" / "MR_small.dcm")
    m = ct.manifest(tmp_path, ['path = "pts"\ntype = "dicom"'])
    out = build(m, tmp_path / "out", jobs=2, progress=False).out
    index = fmt.read_index(out)
    assert [Path(s["path"]).relative_to(tmp_path / "pts").as_posix() for s in index.sources] == [
        "p1/ct_a",
        "p2/ct_b",
        *(["p2/mr"] if mr else []),
    ]
    assert index.stats.get("skipped") == ({"not a CT series": 1} if mr else None)
    got = ct.served(out)
    for name, vol in (("ct_a", chest), ("ct_b", np.ascontiguousarray(chest[:, ::-1]))):
        np.save(tmp_path / "a.npy", vol)
        ref = process_volume(tmp_path / "a.npy", CtSettings(max_points=None))
        np.testing.assert_array_equal(got[name]["coords"], ref.coords)
    recs = {r["file"]: r for rs in index.section("ct")["records"].values() for r in rs}
    assert recs["ct_a"]["header"]["passed_over"] == 1  # the XML beside the slices
    assert recs["ct_b"]["header"]["passed_over"] == 0
    assert recs["ct_a"]["format"] == "dicom" and recs["ct_a"]["axes"] == "LPS"
    assert not build(m, tmp_path / "out", progress=False).changed
    slice_file = sorted((tmp_path / "pts" / "p1" / "ct_a").glob("*.dcm"))[0]
    ds = pydicom.dcmread(slice_file)
    ds.RescaleIntercept = -1000  # one slice 24 HU brighter
    ds.save_as(slice_file)
    assert build(m, tmp_path / "out", progress=False).changed


def test_a_file_path_is_told_to_name_its_folder(tmp_path: Path, chest: np.ndarray) -> None:
    folder = write_dicom_series(tmp_path / "s", chest, AFFINE)
    one = sorted(folder.iterdir())[0]
    with pytest.raises(SourceError, match=rf"{one.name}: a dicom source is a folder holding one"):
        get_source("dicom")(one).header()
