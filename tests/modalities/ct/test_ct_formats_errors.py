"""Bad NIfTI/NRRD input: each a clear error naming the file and what to do, from the header at scan
time (nothing written), never a traceback; a missing reader names the install command. DICOM series:
tests/modalities/ct/test_ct_formats_dicom.py."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.errors import SourceError
from pipeline.extras import MissingExtraError
from pipeline.modalities.ct.demo import make_chest_volume
from pipeline.modalities.ct.writers import chest_affine, write_nifti, write_nrrd
from pipeline.source import get_source

nib = pytest.importorskip("nibabel")
pytest.importorskip("nrrd")
AFFINE = chest_affine((0.7, 0.8, 2.5), (10.0, 20.0, -30.0))  # LPS-stored, as scanners give it


@pytest.fixture(scope="module")
def chest() -> np.ndarray:
    return make_chest_volume((32, 30, 12), 3)[0]


def _bad_nifti(d: Path) -> dict[str, tuple[Path, str]]:
    vol = make_chest_volume((16, 16, 8), 1)[0]
    cut = write_nifti(d / "cut.nii.gz", vol, AFFINE)
    cut.write_bytes(cut.read_bytes()[:-100])
    short = write_nifti(d / "short.nii", vol, AFFINE)
    short.write_bytes(short.read_bytes()[:-10])
    nib.save(nib.Nifti1Image(vol[:, :, 0], np.eye(4)), d / "flat.nii.gz")
    nib.save(nib.Nifti1Image(np.stack([vol, vol], axis=-1), np.eye(4)), d / "time.nii.gz")
    rgb = np.zeros((8, 8, 8), dtype=[("R", "u1"), ("G", "u1"), ("B", "u1")])
    nib.save(nib.Nifti1Image(rgb, np.eye(4)), d / "rgb.nii")
    (d / "junk.nii").write_bytes(b"not a nifti header" * 30)
    return {
        "cut.nii.gz": (cut, "truncated gzip"),
        "short.nii": (short, "truncated .nii"),
        "flat.nii.gz": (d / "flat.nii.gz", "a 2-D image"),
        "time.nii.gz": (d / "time.nii.gz", "4-D image"),
        "rgb.nii": (d / "rgb.nii", "not an integer or float"),
        "junk.nii": (d / "junk.nii", "not a readable"),
    }


def _bad_nrrd(d: Path) -> dict[str, tuple[Path, str]]:
    vol = make_chest_volume((16, 16, 8), 1)[0]
    cut = write_nrrd(d / "cut.nrrd", vol, AFFINE)
    cut.write_bytes(cut.read_bytes()[:-60])
    import nrrd

    nrrd.write(
        str(d / "time.nrrd"),
        np.stack([vol, vol]),
        {"kinds": ["list", "domain", "domain", "domain"]},
    )
    nrrd.write(str(d / "flat.nrrd"), vol[:, :, 0])
    nrrd.write(
        str(d / "rgb.nrrd"),
        np.zeros((3, 16, 16), np.uint8),
        {"kinds": ["RGB-color", "domain", "domain"]},
    )
    lost = write_nrrd(d / "lost.nhdr", vol, AFFINE, encoding="raw")
    (d / "lost.raw").unlink()
    return {
        "cut.nrrd": (cut, "truncated gzip"),
        "time.nrrd": (d / "time.nrrd", r"sizes \(2, 16, 16, 8\) \(axis kinds .*\): a non-"),
        "rgb.nrrd": (d / "rgb.nrrd", "a non-spatial axis"),
        "flat.nrrd": (d / "flat.nrrd", "a 2-D image"),
        "lost.nhdr": (lost, "data file .* is missing"),
    }


@pytest.mark.parametrize("make", [_bad_nifti, _bad_nrrd])
def test_bad_files_fail_the_scan_naming_the_file(tmp_path: Path, make: Any) -> None:
    """Each bad file is a SourceError from the header alone (scan time: nothing is written), naming
    the file and what is wrong: a cut gzip is caught by its trailer, not an hour later while
    packing."""
    for name, (path, msg) in make(tmp_path).items():
        src = get_source("nifti" if ".nii" in name else "nrrd")(path)
        with pytest.raises(SourceError, match=rf"{name}: .*{msg}"):
            src.header()


def test_one_time_point_is_a_volume(tmp_path: Path, chest: np.ndarray) -> None:
    """A 4-D file whose extra axis has length 1 (NIfTI's (X, Y, Z, 1), NRRD's leading list axis) is
    the volume itself, read as the same array."""
    import nrrd

    nib.save(nib.Nifti1Image(chest[..., None], AFFINE), tmp_path / "t.nii.gz")
    nrrd.write(
        str(tmp_path / "t.nrrd"), chest[None], {"kinds": ["list", "domain", "domain", "domain"]}
    )
    for typ, name in (("nifti", "t.nii.gz"), ("nrrd", "t.nrrd")):
        src = get_source(typ)(tmp_path / name)
        h = src.header()
        assert h.shape == chest.shape
        np.testing.assert_array_equal(np.asarray(src.open(h).array), chest)


def test_real_4d_nifti_from_nibabel_is_refused(tmp_path: Path) -> None:
    real = Path(nib.__file__).parent / "tests" / "data" / "example4d.nii.gz"  # a real fMRI run
    if not real.exists():
        pytest.skip("nibabel's test data is not installed")
    with pytest.raises(
        SourceError, match=r"example4d\.nii\.gz: a 4-D image of shape \(128, 96, 24, 2\)"
    ):
        get_source("nifti")(real).header()


@pytest.mark.process
def test_cli_exits_2_naming_the_file_without_a_traceback(
    ct: Any, tmp_path: Path, chest: np.ndarray
) -> None:
    (tmp_path / "v").mkdir()
    write_nifti(tmp_path / "v" / "good.nii.gz", chest, AFFINE)
    bad = write_nifti(tmp_path / "v" / "cut.nii.gz", chest, AFFINE)
    bad.write_bytes(bad.read_bytes()[: len(bad.read_bytes()) // 2])
    m = ct.manifest(tmp_path, ['path = "v/*.nii.gz"'])
    r = ct.cli_build(m, tmp_path / "out")
    assert r.returncode == 2 and "cut.nii.gz: truncated gzip" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "index.json").exists()


def test_a_missing_reader_names_the_install_command(
    tmp_path: Path, chest: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    write_nrrd(tmp_path / "v.nrrd", chest, AFFINE)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nrrd" else real(name, *a)
    )
    with pytest.raises(
        MissingExtraError,
        match=r"NRRD CT volumes .* needs the optional package "
        r'pynrrd.*pip install -e "\.\[ct\]"',
    ):
        get_source("nrrd")(tmp_path / "v.nrrd").header()


def test_gzip_members_and_trailer(tmp_path: Path) -> None:
    """The trailer check accepts a multi-member gzip (bgzip-style) holding enough bytes and refuses
    one cut inside its last member, or too short."""
    from pipeline.modalities.ct.formats import gzip_trailer_ok

    p = tmp_path / "x.gz"
    p.write_bytes(gzip.compress(b"a" * 5000) + gzip.compress(b"b" * 5000))
    gzip_trailer_ok(p, 0, 10_000)
    with pytest.raises(SourceError, match="decompresses to 10000 bytes, the header promises 1000"):
        gzip_trailer_ok(p, 0, 10_001)
    p.write_bytes(p.read_bytes()[:-9])
    with pytest.raises(SourceError, match="stops before its end marker"):
        gzip_trailer_ok(p, 0, 10_000)
