"""Source type ``nrrd``: one CT volume per ``.nrrd`` (attached) or ``.nhdr`` (+ its data file), read
with pynrrd (the ``ct`` extra). 3D Slicer saves volumes this way, and pyradiomics ships its test
lungs so.

The array is what ``nrrd.read`` returns (``index_order="F"``: axis ``i`` is the header's
``sizes[i]``, the stored axes, no reorientation). Geometry comes from ``space directions`` (one
vector per axis: its length is the spacing, its direction the column of the direction matrix) and
``space origin``, converted to RAS from the header's ``space`` (LPS, as Slicer writes, has x and y
negated); a header with only ``spacings`` gives a spacing and no direction.

Memory: ``raw`` data (attached or in the ``.nhdr``'s data file) is memory-mapped, read slab by slab
like a ``.npy``. ``gzip``/``bzip2`` data is decompressed by pynrrd into memory (the stored dtype:
+1 x the grid's int16 bytes for int16, plus the compressed bytes while it runs); a gzip is checked
for truncation at scan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import SourceError
from pipeline.modalities.ct.formats import (
    READ_ERRORS,
    Opened,
    VolumeHeader,
    VolumeSource,
    check_dtype,
    gzip_trailer_ok,
    shape3,
)
from pipeline.modalities.ct.geometry import Geometry, lps_to_ras
from pipeline.source import register_source

SUFFIXES = (".nrrd", ".nhdr")
TO_RAS = {  # NRRD space -> signs that take its x, y, z to RAS
    "right-anterior-superior": (1, 1, 1),
    "ras": (1, 1, 1),
    "left-anterior-superior": (-1, 1, 1),
    "las": (-1, 1, 1),
    "left-posterior-superior": (-1, -1, 1),
    "lps": (-1, -1, 1),
}
GZIP, RAW = ("gzip", "gz"), ("raw",)
SPATIAL = ("domain", "space", "???", "none")  # kinds of a volume's axes (not: time, list...)
HEADER_LIMIT = 1 << 16  # bytes of an .nhdr read to find its data file (headers are a few hundred)


@register_source
class NrrdSource(VolumeSource):
    type = "nrrd"
    format = "nrrd"
    suffixes = SUFFIXES
    reader = "nrrd"

    def _header(self) -> tuple[dict[str, Any], int]:
        """pynrrd's header and the byte where an attached file's data starts."""
        self.need_reader()
        import nrrd  # optional extra ct

        try:
            with open(self.path, "rb") as fh:
                head = nrrd.read_header(fh)
                return dict(head), fh.tell()
        except FileNotFoundError:
            raise SourceError(self.path, "file not found") from None
        except (nrrd.NRRDError, StopIteration, KeyError, *READ_ERRORS) as e:
            raise SourceError(
                self.path, f"not a readable NRRD header ({type(e).__name__}: {e})"
            ) from None

    @classmethod
    def companions(cls, path: Path) -> list[Path]:
        """An ``.nhdr``'s data file (the voxels live there), from the header's text alone."""
        if path.suffix.lower() != ".nhdr":
            return []
        name = _header_data_file(path)
        return [] if name is None else [data_path(path, name)]

    def _data_file(self, head: dict[str, Any]) -> Path | None:
        name = head.get("data file", head.get("datafile"))
        if name is None:
            return None
        if not isinstance(name, str) or name.startswith("LIST") or " " in name.strip():
            raise SourceError(
                self.path,
                f"data file {name!r}: a list of data files is not "
                "supported; save the volume as one .nrrd (3D Slicer: Save as .nrrd)",
            )
        p = data_path(self.path, name)
        if not self.allow_outside_data and not _inside(self.path.parent, p):
            raise SourceError(
                self.path,
                f"its data file {name!r} is outside the header's folder ({p}): a header must "
                "not pack another file's bytes unasked; move the data file beside the .nhdr, "
                "or set allow_outside_data = true in the manifest's [ct] section",
            )
        if not p.is_file():
            raise SourceError(
                self.path, f"its data file {p} is missing (an .nhdr needs the file it names)"
            )
        return p

    def header(self) -> VolumeHeader:
        import nrrd  # optional extra ct

        head, start = self._header()
        try:
            dtype = np.dtype(nrrd.reader._determine_datatype(head))
        except (KeyError, nrrd.NRRDError) as e:
            raise SourceError(self.path, f"unusable type/endian in the header ({e})") from None
        check_dtype(self.path, dtype)
        sizes = tuple(int(n) for n in head.get("sizes", ()))
        kinds = [str(k) for k in head.get("kinds", [])]
        nonspatial = [i for i, k in enumerate(kinds) if k.lower() not in SPATIAL]
        extra = f" (axis kinds {kinds})" if nonspatial else ""
        if any(sizes[i] > 1 for i in nonspatial):  # a 4-D list/time axis, or vectors per voxel
            raise SourceError(
                self.path,
                f"a {len(sizes)}-D NRRD of sizes {sizes}{extra}: a "
                "non-spatial axis (time, a list, colour or vector components) "
                "longer than 1, not one CT volume; extract the volume you want into "
                "its own file",
            )
        shape = shape3(self.path, sizes, extra)
        data = self._data_file(head)
        enc = str(head.get("encoding", "raw")).lower()
        if enc not in (*RAW, *GZIP, "bzip2", "bz2"):
            raise SourceError(
                self.path,
                f"encoding {enc!r} is not supported (raw, gzip, bzip2): "
                "re-save the volume with raw or gzip encoding",
            )
        nbytes = int(np.prod(sizes)) * dtype.itemsize
        where, first = (data, 0) if data is not None else (self.path, start)
        skip, lines = _skips(head)
        if enc in GZIP and skip == 0 and lines == 0:
            gzip_trailer_ok(where, first, nbytes)
        elif enc in RAW and skip >= 0 and where.stat().st_size < first + skip + nbytes:
            have = where.stat().st_size - first - skip
            raise SourceError(
                where,
                f"truncated NRRD data: {have} bytes, the header promises "
                f"{nbytes} ({sizes} {dtype}); copy the file again",
            )
        elif enc in RAW and skip >= 0 and data is not None and where.stat().st_size > skip + nbytes:
            have = where.stat().st_size - skip
            raise SourceError(
                where,
                f"the data file holds {have} bytes, the header {self.path.name} promises "
                f"{nbytes} ({sizes} {dtype}): the wrong data file, or a header of another "
                "volume; fix the header's sizes/type or point it at its own data file",
            )
        geometry = self._geometry(head, len(sizes), nonspatial)
        return VolumeHeader(
            self.path,
            shape,
            dtype.str,
            geometry,
            self.format,
            companions=() if data is None else (data,),
            facts={"encoding": enc, "space": head.get("space")},
        )

    def _geometry(self, head: dict[str, Any], ndim: int, nonspatial: list[int]) -> Geometry:
        axes = [i for i in range(ndim) if i not in nonspatial][:3]
        dirs = head.get("space directions")
        if dirs is not None:
            m = np.asarray(dirs, dtype=np.float64)
            cols = np.stack([m[i] for i in axes], axis=1)  # column j: world step of array axis j
            if cols.shape != (3, 3) or not np.all(np.isfinite(cols)):
                raise SourceError(
                    self.path, f"space directions {m.tolist()} do not give 3 spatial axes"
                )
            space = str(head.get("space", "")).lower()
            origin = np.asarray(head.get("space origin", np.zeros(3)), dtype=np.float64)
            if space in ("left-posterior-superior", "lps"):
                o, cols = lps_to_ras(origin, cols)
            elif space in TO_RAS:
                signs = np.asarray(TO_RAS[space], np.float64)
                o, cols = tuple(origin * signs), cols * signs[:, None]
            else:  # scanner-xyz, 3D-right-handed...: a frame we cannot name, kept as it is
                g = self._from_columns(origin, cols)
                return Geometry(g.spacing, g.origin, g.direction, None)
            return self._from_columns(np.asarray(o), cols)
        spacings = head.get("spacings")
        if spacings is not None:
            sp = [float(spacings[i]) for i in axes]
            if all(np.isfinite(sp)) and min(sp) > 0:
                return Geometry((sp[0], sp[1], sp[2]))
        return Geometry()

    def _from_columns(self, origin: np.ndarray, cols: np.ndarray) -> Geometry:
        aff = np.eye(4)
        aff[:3, :3], aff[:3, 3] = cols, origin
        try:
            return Geometry.from_affine(aff)
        except ValueError as e:
            raise SourceError(self.path, f"unusable space directions: {e}") from None

    def open(self, header: VolumeHeader) -> Opened:
        import nrrd  # optional extra ct

        head, start = self._header()
        enc = str(head.get("encoding", "raw")).lower()
        dtype = np.dtype(header.dtype)
        sizes = tuple(int(n) for n in head["sizes"])
        skip, lines = _skips(head)
        data = header.companions[0] if header.companions else None
        try:
            if enc in RAW and lines == 0 and skip >= -1:
                where, first = (data, 0) if data is not None else (self.path, start)
                nbytes = int(np.prod(sizes)) * dtype.itemsize
                offset = where.stat().st_size - nbytes if skip == -1 else first + skip
                arr = np.memmap(where, dtype=dtype, mode="r", offset=offset, shape=sizes, order="F")
            elif data is not None:
                arr = nrrd.read_data(head, filename=str(self.path), index_order="F")
            else:
                arr = _read_attached(self.path, head)
        except (nrrd.NRRDError, *READ_ERRORS) as e:
            raise SourceError(
                self.path,
                f"cannot read the voxels ({type(e).__name__}: {e}); the "
                "file is damaged or cut short: copy or export it again",
            ) from None
        return Opened(arr.reshape(header.shape, order="A"), header.geometry)


def data_path(header: Path, name: str) -> Path:
    """Where an ``.nhdr``'s ``data file:`` points: absolute, or relative to the header's folder."""
    return Path(name) if Path(name).is_absolute() else header.parent / name


def _inside(folder: Path, p: Path) -> bool:
    """Whether ``p`` (symlinks and ``..`` resolved) lies in ``folder`` or below it."""
    return p.resolve().is_relative_to(folder.resolve())


def _header_data_file(path: Path) -> str | None:
    """The ``data file:`` field of an ``.nhdr``'s text header (up to its first blank line), or
    None (none, or an unreadable header: the read says why)."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(HEADER_LIMIT).decode("latin-1")
    except OSError:
        return None
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("data file", "datafile"):
            value = value.lstrip("=").strip()
            return None if not value or value.startswith("LIST") or " " in value else value
    return None


def _skips(head: dict[str, Any]) -> tuple[int, int]:
    """(byte skip, line skip): both spellings the format allows."""
    return (
        int(head.get("byte skip", head.get("byteskip", 0))),
        int(head.get("line skip", head.get("lineskip", 0))),
    )


def _read_attached(path: Path, head: dict[str, Any]) -> np.ndarray:
    import nrrd  # optional extra ct

    with open(path, "rb") as fh:
        nrrd.read_header(fh)
        return nrrd.read_data(head, fh, filename=str(path), index_order="F")
