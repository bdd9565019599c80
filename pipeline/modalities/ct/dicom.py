"""Source type ``dicom``: one CT series per folder (one file per slice), read with pydicom (the
``ct`` extra).

Scanners and archives (LIDC-IDRI, TCIA) keep CT this way. A manifest path names folders (``type =
"dicom"``: a folder has no suffix to infer it from); a folder with no DICOM file of its own
stands for the folders below it that hold some (``path = "LIDC-IDRI"`` finds every series
folder), sorted.

* **One series.** Files are grouped by SeriesInstanceUID; a folder holding several is an error
  listing them, unless the source's ``series`` key names one. Files that are not DICOM images
  (DICOMDIR, XML annotations, structured reports) are passed over.
* **Order.** Slices are sorted by their ImagePositionPatient projected on the slice normal (the
  cross product of the ImageOrientationPatient rows), never by file or instance number.
* **Checks, before any voxel is read** (a SourceError naming the folder or file and what to do):
  mixed slice sizes or orientations, positions that repeat (a 4-D series: time points), a gap
  larger than 1.5 x the median spacing (missing slices), multi-frame files, a compressed transfer
  syntax whose decoder plug-in is not installed. A series whose Modality is not CT (MR, a DX
  localizer in a LIDC patient) is skipped, counted and logged.
* **HU** = stored value * RescaleSlope + RescaleIntercept, per slice (exact in integers when both
  are).
* **Array:** ``[column, row, slice]``: axis 0 along a row (ImageOrientationPatient's first vector),
  axis 1 down the columns, axis 2 the sorted slices, so an axial series has its axial axis last
  (``axial_axis = -1``, as NIfTI/NRRD have it). Geometry: spacing (PixelSpacing, then the mean step
  between positions), origin (the first slice's position), direction: converted from DICOM's LPS to
  RAS.

Memory: the slices are decoded one at a time into one int16 grid in memory (1 x the grid's int16
bytes).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import SourceError
from pipeline.modalities.ct.formats import READ_ERRORS, Opened, VolumeHeader, VolumeSource, shape3
from pipeline.modalities.ct.geometry import Geometry, lps_to_ras
from pipeline.modalities.ct.mask import I16_MAX, I16_MIN
from pipeline.source import register_source

GAP = 1.5  # a step this many times the median step means missing slices
SAME_POSITION_MM = 1e-3
DECODERS = "pip install pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg (or python-gdcm)"


def _is_dicom(p: Path) -> bool:
    try:
        with open(p, "rb") as fh:
            return fh.read(132)[128:] == b"DICM"
    except OSError:
        return False


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.is_file())


@dataclass(frozen=True)
class Slice:
    """What the series checks need of one file's header."""

    path: Path
    modality: str
    size: tuple[int, int]  # (rows, columns)
    position: tuple[float, ...] | None
    orientation: tuple[float, ...] | None
    pixel_spacing: tuple[float, ...] | None
    slope: float
    intercept: float
    frames: int
    samples: int
    dtype: str
    syntax: str
    series: str  # SeriesInstanceUID
    description: str  # SeriesDescription


@register_source
class DicomSource(VolumeSource):
    type = "dicom"
    format = "dicom"
    suffixes = ()  # a folder: the type is named, never inferred
    options = ("series",)
    reader = "pydicom"
    folders = True  # its paths are folders (the manifest accepts them, fingerprints hash them)

    @classmethod
    def expand(cls, path: Path) -> list[Path]:
        if not path.is_dir():
            return [path]  # header() says what to do instead
        found = []
        for d in [path, *sorted(p for p in path.rglob("*") if p.is_dir())]:
            if any(_is_dicom(f) for f in _files(d)[:8]):
                found.append(d)
            if d == path and found:
                return found  # the folder holds a series itself: subfolders are not other sources
        return found

    def _slices(self) -> tuple[list[Slice], int]:
        """Every DICOM image in the folder (header only), and how many files were passed over."""
        self.need_reader()
        import pydicom  # optional extra ct
        from pydicom.errors import InvalidDicomError  # optional extra ct

        if not self.path.is_dir():
            raise SourceError(
                self.path,
                "a dicom source is a folder holding one series, not a "
                f'file: set path = "{self.path.parent}" (its folder), or a glob of '
                "series folders",
            )
        out, passed = [], 0
        for f in _files(self.path):
            try:
                ds = pydicom.dcmread(f, stop_before_pixels=True)
            except InvalidDicomError:
                passed += 1
                continue
            except (*READ_ERRORS, KeyError, TypeError) as e:
                raise SourceError(f, f"unreadable DICOM header ({type(e).__name__}: {e})") from None
            if "Rows" not in ds or "Columns" not in ds:
                passed += 1  # DICOMDIR, a structured report, a presentation state: no image
                continue
            out.append(_slice(f, ds))
        return out, passed

    def header(self) -> VolumeHeader:
        slices, passed = self._slices()
        if not slices:
            raise SourceError(
                self.path,
                f"no DICOM image in this folder ({passed} files are not "
                "DICOM images): point the source at the folder holding the series' "
                "slice files",
            )
        series, uid = self._pick(slices)
        first = series[0]
        facts: dict[str, Any] = {
            "series": uid,
            "modality": first.modality,
            "files": len(series),
            "passed_over": passed,
        }
        if first.modality.upper() != "CT":
            n = (first.size[1], first.size[0], len(series))
            why = f"not a CT series (Modality {first.modality or 'missing'})"
            return VolumeHeader(
                self.path, n, first.dtype, Geometry(), self.format, facts=facts, skip=why
            )
        _check_series(self.path, series)
        shape = shape3(self.path, (first.size[1], first.size[0], len(series)), " (one slice)")
        _, geometry, steps = _order(self.path, series)
        facts.update(syntax=first.syntax, median_step_mm=float(np.median(steps)))
        return VolumeHeader(self.path, shape, first.dtype, geometry, self.format, facts=facts)

    def _pick(self, slices: list[Slice]) -> tuple[list[Slice], str]:
        groups: dict[str, list[Slice]] = {}
        for s in slices:
            groups.setdefault(s.series, []).append(s)
        want = self.options.get("series")
        if want is not None:
            if str(want) not in groups:
                raise SourceError(
                    self.path,
                    f"series = {want!r} is not in this folder; it holds {_listing(groups)}",
                )
            return groups[str(want)], str(want)
        if len(groups) > 1:
            raise SourceError(
                self.path,
                f"the folder holds {len(groups)} series: "
                f'{_listing(groups)}; set series = "<SeriesInstanceUID>" in this '
                "[[sources]] entry, or give each series its own folder",
            )
        ((uid, series),) = groups.items()
        return series, uid

    def open(self, header: VolumeHeader) -> Opened:
        import pydicom  # optional extra ct

        series, _ = self._pick(self._slices()[0])
        order, _, _ = _order(self.path, series)
        vol = np.empty(header.shape, dtype=np.int16)
        clipped = 0
        for k, i in enumerate(order):
            s = series[i]
            try:
                raw = pydicom.dcmread(s.path).pixel_array
            except (*READ_ERRORS, AttributeError, RuntimeError, NotImplementedError) as e:
                raise SourceError(
                    s.path,
                    f"cannot decode the pixels ({type(e).__name__}: {e}); a "
                    "damaged or cut-short file: copy the series again",
                ) from None
            if raw.shape != s.size:
                raise SourceError(
                    s.path, f"pixel data of shape {raw.shape}, the header says {s.size}"
                )
            if float(s.slope).is_integer() and float(s.intercept).is_integer():
                hu = raw.astype(np.int64) * int(s.slope) + int(s.intercept)
            else:
                hu = np.rint(raw.astype(np.float64) * s.slope + s.intercept)
            n = int(np.count_nonzero(hu < I16_MIN)) + int(np.count_nonzero(hu > I16_MAX))
            if n:
                clipped += n
                hu = np.clip(hu, I16_MIN, I16_MAX)
            vol[:, :, k] = hu.T  # [row, column] -> [column, row]
        return Opened(vol, header.geometry, clipped)


def _floats(ds: Any, key: str) -> tuple[float, ...] | None:
    v = ds.get(key)
    if v is None:
        return None
    try:
        return tuple(float(x) for x in (v if hasattr(v, "__iter__") else [v]))
    except (TypeError, ValueError):
        return None


def _slice(f: Path, ds: Any) -> Slice:
    bits = int(ds.get("BitsAllocated", 16) or 16)
    signed = int(ds.get("PixelRepresentation", 0) or 0) == 1
    meta = getattr(ds, "file_meta", None)
    syntax = str(meta.get("TransferSyntaxUID", "")) if meta is not None else ""

    def text(key: str) -> str:
        return str(ds.get(key, "") or "")

    def number(key: str, default: float) -> float:
        return float(ds.get(key, default) or default)

    return Slice(
        f,
        text("Modality"),
        (int(ds.Rows), int(ds.Columns)),
        _floats(ds, "ImagePositionPatient"),
        _floats(ds, "ImageOrientationPatient"),
        _floats(ds, "PixelSpacing"),
        number("RescaleSlope", 1),
        number("RescaleIntercept", 0),
        int(number("NumberOfFrames", 1)),
        int(number("SamplesPerPixel", 1)),
        np.dtype(f"{'i' if signed else 'u'}{max(1, bits // 8)}").str,
        syntax,
        text("SeriesInstanceUID"),
        text("SeriesDescription"),
    )


def _listing(groups: dict[str, list[Slice]]) -> str:
    return "; ".join(
        f"{uid or '(no SeriesInstanceUID)'} ({ss[0].modality}, {len(ss)} files"
        f"{', ' + repr(ss[0].description) if ss[0].description else ''})"
        for uid, ss in sorted(groups.items())
    )


def _check_series(folder: Path, series: list[Slice]) -> None:
    """Everything that would make a stack wrong, refused before a voxel is read."""
    sizes = Counter(s.size for s in series)
    if len(sizes) > 1:
        common = sizes.most_common(1)[0][0]
        odd = [s.path.name for s in series if s.size != common][:3]
        counts = ", ".join(f"{r}x{c} ({n} files)" for (r, c), n in sizes.items())
        raise SourceError(
            folder,
            f"mixed slice sizes: {counts} (e.g. {', '.join(odd)}): a "
            "localizer or another acquisition in the folder; move it out, or pick "
            "the series with `series`",
        )
    for s in series:
        if s.frames > 1:
            raise SourceError(
                s.path,
                f"a multi-frame (enhanced) DICOM of {s.frames} frames: not "
                "supported; convert the series to NIfTI (dcm2niix) and use type = "
                '"nifti"',
            )
        if s.samples != 1:
            raise SourceError(s.path, f"{s.samples} samples per pixel (colour): not a CT image")
        for key, v, n in (
            ("ImagePositionPatient", s.position, 3),
            ("ImageOrientationPatient", s.orientation, 6),
            ("PixelSpacing", s.pixel_spacing, 2),
        ):
            if v is None or len(v) != n or not np.all(np.isfinite(v)):
                raise SourceError(
                    s.path,
                    f"{key} is missing or malformed ({v}): slices cannot be "
                    "placed; this does not look like a CT image series",
                )
    ref, ref_ps = np.asarray(series[0].orientation), np.asarray(series[0].pixel_spacing)
    for s in series:
        if np.abs(np.asarray(s.orientation) - ref).max() > 1e-3:
            raise SourceError(
                folder,
                f"slices of different orientations ({s.path.name}: "
                f"{list(s.orientation or ())} vs {list(ref)}): a scout or another "
                "acquisition in the folder; move it out",
            )
        if np.abs(np.asarray(s.pixel_spacing) - ref_ps).max() > 1e-4:
            raise SourceError(
                folder,
                f"slices of different PixelSpacing ({s.path.name}: "
                f"{list(s.pixel_spacing or ())} vs {list(ref_ps)}): not one volume",
            )
    syntax = series[0].syntax
    if syntax:
        _check_decoder(series[0].path, syntax)


def _check_decoder(path: Path, syntax: str) -> None:
    from pydicom.pixels import get_decoder  # optional extra ct
    from pydicom.uid import UID  # optional extra ct

    uid = UID(syntax)
    if not uid.is_compressed:
        return
    try:
        decoder = get_decoder(uid)
    except NotImplementedError:
        raise SourceError(
            path,
            f"transfer syntax {uid} ({uid.name}) has no pixel decoder in "
            "pydicom: decompress the series first (gdcmconv --raw, or dcmdjpeg)",
        ) from None
    if not decoder.is_available:
        raise SourceError(
            path,
            f"compressed transfer syntax {uid.name} ({uid}) and no decoder "
            f"plug-in for it is installed: {DECODERS}; or decompress the series "
            "first (gdcmconv --raw, or dcmdjpeg)",
        )


def _order(folder: Path, series: list[Slice]) -> tuple[list[int], Geometry, np.ndarray]:
    """Slice order along the normal, the geometry (RAS) and the steps between sorted positions (mm);
    4-D series (repeated positions) and missing slices refused."""
    iop = np.asarray(series[0].orientation, dtype=np.float64)
    row, col = iop[:3], iop[3:]
    normal = np.cross(row, col)
    pos = np.asarray([s.position for s in series], dtype=np.float64)
    d = pos @ normal
    order = sorted(range(len(series)), key=lambda i: (d[i], series[i].path.name))
    steps = np.diff(d[order])
    if steps.size and steps.min() < SAME_POSITION_MM:
        k = int(np.argmin(steps))
        same = " and ".join([series[order[k]].path.name, series[order[k + 1]].path.name])
        n_pos = len(np.unique(np.round(d / SAME_POSITION_MM)))
        raise SourceError(
            folder,
            f"{len(series)} slices at only {n_pos} positions ({same} both "
            f"at {d[order[k]]:.3f} mm): a 4-D series (time points, or repeated "
            "acquisitions); put each time point in its own folder (or pick one "
            "series with `series`)",
        )
    if steps.size:
        med = float(np.median(steps))
        k = int(np.argmax(steps))
        if steps[k] > GAP * med:
            a, b = series[order[k]].path.name, series[order[k + 1]].path.name
            missing = int(round(steps[k] / med)) - 1
            raise SourceError(
                folder,
                f"missing slices: a gap of {steps[k]:.3f} mm between {a} "
                f"and {b} (median spacing {med:.3f} mm; about {missing} slices "
                "missing): copy the series again, or a stack with holes would be "
                "mis-placed",
            )
    ps = series[0].pixel_spacing or (1.0, 1.0)
    first, last = pos[order[0]], pos[order[-1]]
    step = (last - first) / (len(series) - 1) if len(series) > 1 else normal * 1.0
    cols = np.stack([row * ps[1], col * ps[0], step], axis=1)  # LPS: column j = axis j's step
    origin, cols = lps_to_ras(first, cols)
    aff = np.eye(4)
    aff[:3, :3], aff[:3, 3] = cols, origin
    try:
        geometry = Geometry.from_affine(aff)
    except ValueError as e:
        raise SourceError(folder, f"degenerate slice geometry: {e}") from None
    return order, geometry, steps
