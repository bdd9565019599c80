"""CT volumes, build side: kind ``ct``, the volume sources (``npy``; ``nifti``, ``nrrd``, ``dicom``
with the ``ct`` extra) and the demo chests (registered lazily: the kind imports scipy.ndimage,
which no other build pays for, and a reader library is imported only by a manifest naming its
format)."""

from __future__ import annotations

from pipeline.commands.demo import DEMO_WRITERS
from pipeline.extras import register_extra
from pipeline.model import KINDS
from pipeline.report import register_report_section
from pipeline.source import SOURCES

_HERE = __name__
KINDS.register_lazy("ct", f"{_HERE}.kind")
SOURCES.register_lazy("npy", f"{_HERE}.npy")
SOURCES.register_lazy("nifti", f"{_HERE}.nifti")
SOURCES.register_lazy("nrrd", f"{_HERE}.nrrdfile")
SOURCES.register_lazy("dicom", f"{_HERE}.dicom")
DEMO_WRITERS.register("ct", f"{_HERE}.demo:write_ct_demo")
register_extra("nibabel", "ct", "nibabel", 'NIfTI CT volumes (type = "nifti") and [ct] orientation')
register_extra("nrrd", "ct", "pynrrd", 'NRRD CT volumes (type = "nrrd")')
register_extra("pydicom", "ct", "pydicom", 'DICOM CT series (type = "dicom")')
register_report_section("ct", f"{_HERE}.report:ct_section")
