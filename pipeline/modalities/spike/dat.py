"""Spike-camera ``.dat`` streams (Vidar / SpikeCV / Spike-Zoo convention, or one byte per pixel).

No header; the resolution comes from the manifest, never guessed. ``packing = "bits"``: 8 pixels
per byte, least significant bit first, frames row-major ``(H, W)`` and stored upside down
(``flip_rows``); ``packing = "bytes"``: one uint8 per pixel holding 0 or 1. A file whose size is
not a whole number of frames is an error that names both frame counts (picking the wrong packing
is the common mistake). Reading is vectorised (``np.unpackbits(bitorder="little")``) and touches
only the frames kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np

from pipeline.errors import SourceError
from pipeline.source import Source, register_source

PACKINGS = ("bits", "bytes")


def frame_bytes(height: int, width: int, packing: str) -> int:
    """Bytes of one frame in a file (bits: H*W/8, rounded up per frame; bytes: H*W)."""
    return -(-height * width // 8) if packing == "bits" else height * width


def count_frames(path: Path, height: int, width: int, packing: str) -> int:
    """Frames in ``path``; a size that is not a whole number of frames is a SourceError naming both
    counts."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise SourceError(path, f"cannot read ({e.strerror})") from None
    fb = frame_bytes(height, width, packing)
    if size == 0:
        raise SourceError(path, "is empty (no spike frames)")
    if size % fb:
        other = "bytes" if packing == "bits" else "bits"
        ob = frame_bytes(height, width, other)
        alt = f"{size / ob:g} frames" if size % ob else f"exactly {size // ob} frames"
        raise SourceError(
            path,
            f"size {size} bytes is not a whole number of {height}x{width} frames of {fb} bytes "
            f"with packing={packing!r} ({size / fb:g} frames); with packing={other!r} it would be "
            f"{alt}: check [spike] height, width and packing",
        )
    return size // fb


def read_frames(
    path: Path, height: int, width: int, packing: str, flip_rows: bool, start: int, count: int
) -> np.ndarray:
    """Frames ``[start, start + count)`` as uint8 0/1 ``[count, H, W]`` in the canonical
    orientation."""
    fb = frame_bytes(height, width, packing)
    try:
        raw = np.fromfile(path, dtype=np.uint8, count=count * fb, offset=start * fb)
    except OSError as e:
        raise SourceError(path, f"cannot read ({e.strerror or e})") from None
    if raw.size != count * fb:
        raise SourceError(
            path, f"truncated: {raw.size} of {count * fb} bytes for frames {start}..{start + count}"
        )
    if packing == "bits":
        frames = np.unpackbits(
            raw.reshape(count, fb), axis=1, count=height * width, bitorder="little"
        )
    else:
        bad = np.flatnonzero(raw > 1)
        if bad.size:
            raise SourceError(
                path,
                f"byte {int(raw[bad[0]])} at offset {start * fb + int(bad[0])} is not 0 or 1 "
                '(packing = "bytes" holds one 0/1 byte per pixel; bit-packed files need packing = "bits")',
            )
        frames = raw
    frames = frames.reshape(count, height, width)
    return np.ascontiguousarray(frames[:, ::-1]) if flip_rows else frames


def pack_frames(frames: np.ndarray) -> np.ndarray:
    """0/1 frames ``[T, H, W]`` -> the stored bits ``uint8 [T, H, ceil(W/8)]`` (LSB first along W)."""
    return np.packbits(frames.astype(np.uint8, copy=False), axis=-1, bitorder="little")


@register_source
class DatSource(Source):
    """A ``.dat`` spike stream; a folder given as a source stands for every ``.dat`` below it
    (sorted)."""

    type: ClassVar[str] = "dat"
    kinds: ClassVar[tuple[str, ...]] = ("spike",)
    suffixes: ClassVar[tuple[str, ...]] = (".dat",)
    produces: ClassVar[tuple[str, ...]] = ("spikes", "blur", "sharp")

    @classmethod
    def expand(cls, path: Path) -> list[Path]:
        return sorted(p for p in path.rglob("*.dat") if p.is_file()) if path.is_dir() else [path]
