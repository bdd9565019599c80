"""Write a HU volume as NIfTI, NRRD or a DICOM series, with real geometry, through the readers' own
libraries (the ``ct`` extra): the demo, the tests and the bench make their non-``.npy`` volumes
here, from the same arrays, so every reader is exercised on files the field's tools would accept.

``hu`` is int16 ``[X, Y, Z]`` in the stored axis order the reader gives back, and ``affine`` (4x4,
RAS mm) places it: reading the file back yields the same array and, through :class:`Geometry`, the
same affine.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from pipeline.extras import require
from pipeline.modalities.ct.geometry import LPS_TO_RAS

CT_UID = "1.2.840.10008.5.1.4.1.1.2"  # CT Image Storage


def chest_affine(
    spacing: tuple[float, float, float], origin: tuple[float, float, float], axes: str = "LPS"
) -> np.ndarray:
    """The affine of an axial chest CT whose array axes grow towards ``axes`` (e.g. "LPS", as a
    DICOM series stacked [column, row, slice] is) with ``origin`` (RAS mm) at voxel 0."""
    sign = {"R": (0, 1), "L": (0, -1), "A": (1, 1), "P": (1, -1), "S": (2, 1), "I": (2, -1)}
    a = np.eye(4)
    a[:3, :3] = 0.0
    for j, c in enumerate(axes):
        i, s = sign[c]
        a[i, j] = s * spacing[j]
    a[:3, 3] = origin
    return a


def _atomic(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".tmp-{path.name}")


def write_nifti(path: Path, hu: np.ndarray, affine: np.ndarray) -> Path:
    """``.nii`` or ``.nii.gz`` (by suffix), int16, sform and qform both set (code 1, scanner)."""
    require("nibabel")
    import nibabel as nib  # optional extra ct

    img = nib.Nifti1Image(np.asarray(hu, dtype=np.int16), affine)
    img.set_sform(affine, code=1)
    img.set_qform(affine, code=1)
    img.header.set_slope_inter(1.0, 0.0)
    tmp = _atomic(path)
    nib.save(img, tmp)
    tmp.replace(path)
    return path


def write_nrrd(path: Path, hu: np.ndarray, affine: np.ndarray, encoding: str = "gzip") -> Path:
    """``.nrrd`` (attached) or ``.nhdr`` + ``<stem>.raw[.gz]`` (detached), LPS space as 3D Slicer
    writes."""
    require("nrrd")
    import nrrd  # optional extra ct

    cols = LPS_TO_RAS @ affine[:3, :3]
    header = {
        "type": "int16",
        "dimension": 3,
        "space": "left-posterior-superior",
        "space directions": cols.T,
        "space origin": LPS_TO_RAS @ affine[:3, 3],
        "kinds": ["domain", "domain", "domain"],
        "encoding": encoding,
        "endian": "little",
    }
    data = np.asarray(hu, dtype=np.int16)
    if path.suffix.lower() == ".nhdr":  # pynrrd names the data file itself, beside the header
        path.parent.mkdir(parents=True, exist_ok=True)
        nrrd.write(str(path), data, header, detached_header=True, index_order="F")
        return path
    tmp = _atomic(path)
    nrrd.write(str(tmp), data, header, index_order="F")
    tmp.replace(path)
    return path


def write_dicom_series(
    folder: Path,
    hu: np.ndarray,
    affine: np.ndarray,
    seed: int = 0,
    modality: str = "CT",
    intercept: float = -1024.0,
    slope: float = 1.0,
    series_uid: str | None = None,
    syntax: str | None = None,
    positions: list[int] | None = None,
) -> Path:
    """One file per slice (``[column, row, slice]`` -> ``Rows = Y, Columns = X``), stored values
    ``(HU - intercept) / slope`` as int16, ImagePositionPatient / ImageOrientationPatient /
    PixelSpacing / SliceThickness from ``affine`` (in LPS, as DICOM has it), file names shuffled by
    ``seed`` (so name order is not slice order). ``positions`` writes only those slices (a gap, for
    tests); ``syntax`` another transfer syntax UID (the pixels are then RLE-compressed when it is
    RLE Lossless, else left as they are, which only tests use: a header naming a codec whose
    plug-in is missing)."""
    require("pydicom")
    from pydicom.dataset import FileDataset, FileMetaDataset  # optional extra ct
    from pydicom.uid import ExplicitVRLittleEndian, RLELossless, generate_uid  # optional extra ct

    hu = np.asarray(hu)
    nx, ny, nz = hu.shape
    cols = LPS_TO_RAS @ affine[:3, :3]  # LPS columns: world step of each array axis
    origin = LPS_TO_RAS @ affine[:3, 3]
    sp = np.linalg.norm(cols, axis=0)
    row_dir, col_dir, step = cols[:, 0] / sp[0], cols[:, 1] / sp[1], cols[:, 2]
    key = [folder.name, str(seed), modality]
    study = generate_uid(entropy_srcs=[*key, "study"])
    series_uid = series_uid or generate_uid(entropy_srcs=[*key, "series"])
    frame = generate_uid(entropy_srcs=[*key, "frame"])
    ks = list(range(nz)) if positions is None else list(positions)
    names = np.random.default_rng(seed).permutation(len(ks))
    tmp = _atomic(folder)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for n, k in zip(names.tolist(), ks, strict=True):
        sop = generate_uid(entropy_srcs=[*key, series_uid, str(k)])
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = CT_UID, sop
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = FileDataset(str(tmp / f"IM{n:04d}.dcm"), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = CT_UID, sop, modality
        ds.PatientID, ds.StudyInstanceUID, ds.SeriesInstanceUID = folder.name, study, series_uid
        ds.FrameOfReferenceUID, ds.SeriesDescription = frame, "demo chest"
        ds.InstanceNumber = k + 1
        ds.ImagePositionPatient = [round(float(v), 6) for v in origin + k * step]
        ds.ImageOrientationPatient = [round(float(v), 8) for v in (*row_dir, *col_dir)]
        ds.PixelSpacing = [round(float(sp[1]), 6), round(float(sp[0]), 6)]  # [rows, columns] apart
        ds.SliceThickness = round(float(sp[2]), 6)
        ds.Rows, ds.Columns, ds.SamplesPerPixel = ny, nx, 1
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 1
        ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = intercept, slope, "HU"
        stored = np.rint((hu[:, :, k].T.astype(np.float64) - intercept) / slope).astype("<i2")
        ds.PixelData = np.ascontiguousarray(stored).tobytes()
        if syntax == RLELossless:
            ds.compress(RLELossless)
        elif syntax is not None:  # raw bytes as one fragment: only the header is believable
            from pydicom.encaps import encapsulate  # optional extra ct

            ds.PixelData = encapsulate([ds.PixelData])
            ds["PixelData"].VR = "OB"
            ds.file_meta.TransferSyntaxUID = syntax
        ds.save_as(tmp / f"IM{n:04d}.dcm", enforce_file_format=True)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.replace(folder)
    return folder
