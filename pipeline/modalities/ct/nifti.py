"""Source type ``nifti``: one CT volume per ``.nii`` / ``.nii.gz`` file, read with nibabel (the
``ct`` extra).

LUNA16 conversions, the Medical Segmentation Decathlon and TotalSegmentator ship chest CT this
way. The array is what nibabel returns (``img.dataobj``: the stored axes, no reorientation;
``[ct] orientation`` reorients), HU are ``stored * scl_slope + scl_inter`` (nibabel's scaling
rule), and the geometry is nibabel's ``img.affine`` (the sform when set, else the qform), already
RAS+.

Memory: a ``.nii`` is memory-mapped like a ``.npy`` (read slab by slab, the pages reclaimable). A
``.nii.gz`` cannot be sliced without decompressing what comes before, so its voxels are
decompressed once into memory in their stored dtype (int16: +1 x the grid's int16 bytes). Before
that, at scan time, the gzip's trailer is checked against the size the header promises: a truncated
download fails the scan naming the file, not the pack an hour later.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import SourceError
from pipeline.modalities.ct.formats import (
    READ_ERRORS,
    Opened,
    VolumeHeader,
    VolumeSource,
    check_dtype,
    gzip_trailer_ok,
    scaled,
    shape3,
)
from pipeline.modalities.ct.geometry import Geometry
from pipeline.source import register_source

SUFFIXES = (".nii", ".nii.gz")


@register_source
class NiftiSource(VolumeSource):
    type = "nifti"
    format = "nifti"
    suffixes = SUFFIXES
    reader = "nibabel"

    def _load(self):  # noqa: ANN202 - a nibabel image (an optional import)
        self.need_reader()
        import nibabel as nib  # optional extra ct

        try:
            img = nib.load(self.path, mmap="r")
        except FileNotFoundError:
            raise SourceError(self.path, "file not found") from None
        except (nib.filebasedimages.ImageFileError, *READ_ERRORS) as e:
            raise SourceError(
                self.path, f"not a readable NIfTI file ({type(e).__name__}: {e})"
            ) from None
        if not isinstance(img, nib.Nifti1Image | nib.Nifti2Image):
            raise SourceError(self.path, f"nibabel reads it as {type(img).__name__}, not NIfTI")
        return img

    def header(self) -> VolumeHeader:
        img = self._load()
        proxy = img.dataobj
        dtype = np.dtype(img.header.get_data_dtype())
        check_dtype(self.path, dtype)
        shape = shape3(self.path, tuple(img.shape))
        nbytes = int(np.prod(img.shape)) * dtype.itemsize
        end = int(proxy.offset) + nbytes
        if self.path.name.lower().endswith(".gz"):
            gzip_trailer_ok(self.path, 0, end)
        elif self.path.stat().st_size < end:
            raise SourceError(
                self.path,
                f"truncated .nii: {self.path.stat().st_size} bytes, the "
                f"header promises {end} ({tuple(img.shape)} {dtype}); copy the file "
                "again",
            )
        try:
            geometry = Geometry.from_affine(img.affine)
        except ValueError as e:
            raise SourceError(self.path, f"unusable affine in the header: {e}") from None
        sform, qform = int(img.header["sform_code"]), int(img.header["qform_code"])
        facts = {
            "slope": float(proxy.slope),
            "inter": float(proxy.inter),
            "affine_from": "sform" if sform > 0 else "qform" if qform > 0 else "pixdim only",
        }
        return VolumeHeader(self.path, shape, dtype.str, geometry, self.format, facts=facts)

    def open(self, header: VolumeHeader) -> Opened:
        img = self._load()
        try:
            raw = img.dataobj.get_unscaled()  # a memory map for .nii; in memory for .nii.gz
        except READ_ERRORS as e:
            raise SourceError(
                self.path,
                f"cannot read the voxels ({type(e).__name__}: {e}); the "
                "file is damaged: copy or export it again",
            ) from None
        raw = raw.reshape(header.shape, order="A")  # trailing axes of length 1 dropped (a view)
        return Opened(scaled(raw, img.dataobj.slope, img.dataobj.inter), header.geometry)
