"""What every CT volume source shares: its header facts, the opened volume, slope/intercept, gzip
checks.

A source (``npy``, ``nifti``, ``nrrd``, ``dicom``) answers two calls. :meth:`VolumeSource.header`
reads the header alone, at scan time, so bad input fails before anything is written (the build's
rule): shape, stored dtype, :class:`~pipeline.modalities.ct.geometry.Geometry`, the other files the
volume depends on, or why it is skipped. :meth:`VolumeSource.open` gives the voxels as an
array-like whose axis-0 slabs the slab-wise code reads (``vol[a:b]``): a memory map where the file
allows it (raw ``.nii``, raw NRRD), else the volume in memory (gzip, DICOM slices), with
slope/intercept applied one slab at a time (:class:`Scaled`).
"""

from __future__ import annotations

import zlib
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pipeline.errors import SourceError
from pipeline.extras import require
from pipeline.modalities.ct.geometry import Geometry
from pipeline.source import Source

# what a broken file raises inside the readers
READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, MemoryError)


@dataclass(frozen=True)
class VolumeHeader:
    """One volume's header, read without its voxels."""

    path: Path
    shape: tuple[int, int, int]
    dtype: str  # the stored dtype, before slope/intercept
    geometry: Geometry
    format: str
    companions: tuple[Path, ...] = ()  # other files the voxels come from (an .nhdr's data file)
    skip: str | None = None  # a counted skip decided from the header (a non-CT DICOM series)
    facts: Mapping[str, Any] = field(default_factory=dict)  # JSON-able extras kept in the record

    def record_info(self) -> dict[str, Any]:
        """``Record.info``: part of every shard key, so a changed companion file rebuilds its shard."""
        info: dict[str, Any] = {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "format": self.format,
        }
        if self.companions:
            info["companions"] = [_stamp(p) for p in self.companions]
        if self.skip:
            info["skip"] = self.skip
        return info


def _stamp(p: Path) -> list[Any]:
    st = p.stat()
    return [p.name, st.st_size, st.st_mtime_ns]


@dataclass
class Opened:
    """A volume ready for the slab-wise code: ``array[a:b]`` gives rows ``a..b`` of axis 0."""

    array: Any
    geometry: Geometry
    clipped: int = 0  # values clipped into int16 while reading (DICOM slices)


class Scaled:
    """``raw * slope + inter``, computed per slab (a 512^3 volume never exists scaled). Integer
    slope and intercept (DICOM's usual 1 and -1024) stay exact in int64; others give float64
    (rounded by the caller)."""

    def __init__(self, raw: Any, slope: float, inter: float) -> None:
        self.raw, self.slope, self.inter = raw, float(slope), float(inter)
        self.exact = self.slope.is_integer() and self.inter.is_integer()
        self.shape = tuple(raw.shape)
        self.ndim = len(self.shape)
        self.dtype = np.dtype(np.int64 if self.exact and raw.dtype.kind in "iu" else np.float64)

    def __getitem__(self, key: Any) -> np.ndarray:
        s = np.asarray(self.raw[key])
        if self.exact and s.dtype.kind in "iu":
            return s.astype(np.int64) * int(self.slope) + int(self.inter)
        return s.astype(np.float64) * self.slope + self.inter

    def view(self, fn: Callable[[Any], Any]) -> Scaled:
        return Scaled(fn(self.raw), self.slope, self.inter)


def scaled(raw: Any, slope: float, inter: float) -> Any:
    """``raw`` itself when the scaling is the identity (the stored bytes are the HU), else
    :class:`Scaled`."""
    return raw if (slope, inter) == (1.0, 0.0) else Scaled(raw, slope, inter)


def view(arr: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` (flips, transposes) applied to the stored array, beneath any scaling."""
    return arr.view(fn) if isinstance(arr, Scaled) else fn(arr)


class VolumeSource(Source):
    """Base of the CT volume sources (one volume per source path)."""

    kinds = ("ct",)
    produces = ("coords", "hu", "window", "volume_shape")
    format: ClassVar[str]
    reader: ClassVar[str | None] = None  # the module the format needs (from an extra), if any
    # the manifest's [ct] allow_outside_data: a header may name a data file outside its folder
    allow_outside_data: bool = False

    def __init__(self, path: str | Path, **options: object) -> None:
        super().__init__(path, **options)
        self.options = dict(options)

    @classmethod
    def expand(cls, path: Path) -> list[Path]:
        """A folder stands for the files directly in it that carry one of the type's suffixes."""
        if path.is_dir():
            return sorted(
                p for p in path.iterdir() if p.name.lower().endswith(cls.suffixes) and p.is_file()
            )
        return [path]

    def need_reader(self) -> None:
        """MissingExtraError (exit 2, naming ``pip install -e ".[ct]"``) when the reader is not
        installed."""
        if self.reader is not None:
            require(self.reader)

    @abstractmethod
    def header(self) -> VolumeHeader:
        """Shape, dtype, geometry from the header (SourceError naming the file on bad input)."""

    @abstractmethod
    def open(self, header: VolumeHeader) -> Opened:
        """The voxels (SourceError naming the file when they cannot be read)."""


def shape3(path: Path, shape: tuple[int, ...], what: str = "") -> tuple[int, int, int]:
    """A 3-D grid from a header's shape: trailing axes of length 1 dropped; 2-D images and 4-D
    series (time, echoes, a vector per voxel) refused naming the file and what to do."""
    dims = tuple(int(n) for n in shape)
    while len(dims) > 3 and 1 in dims:  # e.g. NIfTI's (X, Y, Z, 1): one time point is a volume
        i = len(dims) - 1 - dims[::-1].index(1)
        dims = dims[:i] + dims[i + 1 :]
    if len(dims) > 3:
        raise SourceError(
            path,
            f"a {len(dims)}-D image of shape {dims}{what}: a series over "
            "time (or echoes, vectors), not one CT volume; extract the volume you "
            "want (e.g. nibabel's img.slicer[..., t]) into its own file",
        )
    if len(dims) < 3 or min(dims) < 2:
        raise SourceError(
            path,
            f"a 2-D image of shape {dims}{what}, not a CT volume: point the "
            "source at 3-D volumes (a single slice cannot be masked as a volume)",
        )
    return dims[0], dims[1], dims[2]


def check_dtype(path: Path, dtype: np.dtype) -> None:
    if dtype.fields is not None or dtype.kind not in "iuf":
        raise SourceError(
            path,
            f"voxel type {dtype} is not an integer or float scalar (RGB, "
            "complex and structured voxels are not CT Hounsfield units)",
        )


def gzip_trailer_ok(path: Path, start: int, expected: int) -> None:
    """SourceError naming ``path`` when its gzip stream (from byte ``start`` to the end) is
    truncated or corrupt or holds fewer than ``expected`` bytes. The cheap test first: a single
    gzip member ends with its uncompressed size mod 2^32 (ISIZE); only when that disagrees (a cut
    file, or several members, as bgzip writes) is the stream decompressed, a MiB at a time, to
    count."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            end = fh.tell()
            if end - start >= 18:
                fh.seek(end - 4)
                if int.from_bytes(fh.read(4), "little") == expected % 2**32:
                    return
            fh.seek(start)
            total, d, open_member = 0, zlib.decompressobj(zlib.MAX_WBITS | 16), False
            while chunk := fh.read(1 << 20):
                while chunk:
                    total += len(d.decompress(chunk))
                    open_member, chunk = not d.eof, b""
                    if d.eof:  # the next member (bgzip writes several) starts in the unused bytes
                        chunk, d = d.unused_data, zlib.decompressobj(zlib.MAX_WBITS | 16)
    except zlib.error as e:
        raise SourceError(
            path, f"corrupt gzip data ({e}): re-export or re-download the file"
        ) from None
    except OSError as e:
        raise SourceError(path, f"cannot read ({e.strerror or e})") from None
    if open_member or total < expected:
        raise SourceError(
            path,
            f"truncated gzip: it decompresses to {total} bytes"
            f"{' and stops before its end marker' if open_member else ''}, the "
            f"header promises {expected}; the file was cut short (copy or download "
            "it again)",
        )
