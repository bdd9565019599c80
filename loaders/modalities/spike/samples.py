"""The ``spike`` sample type: spike-camera windows made into voxel grids at load time (no torch
here).

Shards store each record's spike window bit-packed, 1 bit per pixel, rows in the canonical
orientation, in one of two bit orders (``index.json`` spike section ``bit_order``):
``pixel_major`` (the default since the spikebits codec moved into the layout: ``spikes`` uint8
``[H, W, ceil(T/8)]``, a byte = 8 frames of one pixel, voxels by popcount,
:mod:`loaders.modalities.spike.ops`) or ``frame_major`` (as the camera writes them, and every
index without ``bit_order``: ``[T, H, ceil(W/8)]``, LSB first along W, voxels by unpacking).
Optional paired images uint8 ``[C, H', W']`` and the record's ``sequence`` and ``frame``. A unit
is a clip: ``clip_len`` consecutive records of one sequence (the ``clips`` table the planner
built), or one record when the dataset was built with ``clip_len = 1``.

A batch: ``voxel`` float32 ``[B, clip_len, num_bins, h, w]`` (frames summed per bin, cropped),
the images float32 in [0, 1] ``[B, clip_len, C, h', w']`` cropped at the matching place (scaled
by image/spike size), ``sample_id``/``sequence``/``frame`` ``[B, clip_len]`` and ``crop`` ``[B,
2]`` (top, left in spike pixels). The crop is drawn from ``(seed, epoch, unit id)``: reproducible
and resumable. The voxel grid is a *deferred* op: with ``device="cuda"`` the packed bits cross to
the GPU and are unpacked, cropped and binned there (``loaders.modalities.spike.torch_ops``);
otherwise numpy does the same here, with equal results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from loaders.format import SAMPLE_ID, FormatError, Index
from loaders.modalities.spike.ops import FRAME_MAJOR, PIXEL_MAJOR, PixelVoxels, crop_pixels
from loaders.samples import SampleType, register_sample_type, unit_hash
from loaders.samples.payload import Deferred, Payload, register_op

if TYPE_CHECKING:
    from loaders.samples.gather import BatchRows

SPIKES, SEQUENCE, FRAME, CLIPS = "spikes", "sequence", "frame", "clips"
VOXEL_OP = "spike_voxel"


def crop_offsets(
    seed: int, epoch: int, unit_ids: np.ndarray, size: tuple[int, int], crop: tuple[int, int] | None
) -> np.ndarray:
    """int64 ``[B, 2]`` (top, left) per unit from :func:`~loaders.samples.unit_hash` of ``(seed,
    epoch, unit id)``: the high 32 bits pick the top, the low 32 the left; zeros without a crop."""
    out = np.zeros((unit_ids.size, 2), np.int64)
    if crop is None:
        return out
    h = unit_hash(seed, epoch, unit_ids)
    with np.errstate(over="ignore"):
        spans = np.array([size[0] - crop[0] + 1, size[1] - crop[1] + 1], np.uint64)
        out[:, 0] = ((h >> np.uint64(32)) % spans[0]).astype(np.int64)
        out[:, 1] = ((h & np.uint64(0xFFFFFFFF)) % spans[1]).astype(np.int64)
    return out


def crop_bits(
    windows: list[np.ndarray], offsets: np.ndarray, crop: tuple[int, int] | None, clip_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """The packed rows each unit's crop needs, ``uint8 [B*L, T, h, Wb]``, and each unit's left edge
    ``[B]``.

    Whole packed rows of the crop's ``h`` rows are copied (per frame one contiguous block:
    copying only the crop's bytes would be thousands of 17-byte pieces, 3x slower here); the
    finisher unpacks just the bytes covering the crop's columns. A 128-row crop of 250-row frames
    moves half the window to the device."""
    if crop is None:
        return np.stack(windows), np.zeros(offsets.shape[0], np.int64)
    h = crop[0]
    out = np.empty((len(windows), windows[0].shape[0], h, windows[0].shape[2]), np.uint8)
    for i, win in enumerate(windows):
        y = int(offsets[i // clip_len, 0])
        out[i] = win[:, y : y + h]
    return out, offsets[:, 1].astype(np.int64)


def voxel_numpy(
    bits: np.ndarray,
    left: np.ndarray,
    width: int,
    num_bins: int,
    clip_len: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Packed rows ``[B*L, T, h, Wb]`` -> float32 voxels ``[B, L, num_bins, h, width]`` from column
    ``left[b]``: unpack only the bytes covering the crop, sum frames in ``num_bins`` groups in
    uint8 (or uint16 past 255 frames a bin), then drop the leading bits of the first byte and
    widen once."""
    m, t, h = bits.shape[0], bits.shape[1], bits.shape[2]
    b = m // max(clip_len, 1)
    res = (
        np.zeros((b, clip_len, num_bins, h, width), np.float32)
        if out is None
        else out.reshape(b, clip_len, num_bins, h, width)
    )
    acc = np.uint16 if t // num_bins > 255 else np.uint8
    nb = -(-width // 8) + 1
    for i in range(b):
        x = int(left[i])
        sub = bits[i * clip_len : (i + 1) * clip_len, :, :, x // 8 : x // 8 + nb]
        frames = np.unpackbits(sub, axis=-1, bitorder="little")
        sums = frames.reshape(clip_len, num_bins, t // num_bins, h, frames.shape[-1]).sum(
            axis=2, dtype=acc
        )
        res[i] = sums[..., x % 8 : x % 8 + width]
    return res


@register_op(VOXEL_OP, torch_module="loaders.modalities.spike.torch_ops")
def _voxel_op(
    parts: Mapping[str, np.ndarray], meta: Mapping[str, Any], out: np.ndarray | None
) -> np.ndarray:
    return voxel_numpy(
        parts["bits"],
        parts["left"],
        int(meta["width"]),
        int(meta["num_bins"]),
        int(meta["clip_len"]),
        out,
    )


@dataclass
class Voxels(Deferred):
    op: ClassVar[str] = VOXEL_OP
    bits: np.ndarray
    left: np.ndarray
    width: int
    num_bins: int
    clip_len: int

    def parts(self) -> dict[str, np.ndarray]:
        return {"bits": self.bits, "left": self.left}

    def meta(self) -> dict[str, Any]:
        return {"width": self.width, "num_bins": self.num_bins, "clip_len": self.clip_len}

    def out_shape(self) -> tuple[int, ...]:
        return (
            self.bits.shape[0] // self.clip_len,
            self.clip_len,
            self.num_bins,
            self.bits.shape[2],
            self.width,
        )


def bit_order(index: Index) -> str:
    """The stored bit order (indexes before pixel-major shards name none: frame-major); unknown ->
    FormatError."""
    order = str(index.section("spike").get("bit_order", FRAME_MAJOR))
    if order not in VOXELS:
        raise FormatError(
            f"{index.root}: spike bit_order {order!r} is unknown to this shardsmith (known: "
            f"{sorted(VOXELS)}): upgrade shardsmith to read it"
        )
    return order


def stored_frames(index: Index) -> int:
    """Frames of a stored window: the frame-major column's first axis, or the section's
    ``window_frames``."""
    if bit_order(index) == PIXEL_MAJOR:
        return int(index.section("spike")["window_frames"])
    return int(index.field(SPIKES).shape[0])


def _frame_major(
    windows: list[np.ndarray],
    offsets: np.ndarray,
    crop: tuple[int, int] | None,
    length: int,
    width: int,
    frames: int,
    bins: int,
) -> Deferred:
    bits, left = crop_bits(windows, offsets, crop, length)
    return Voxels(bits, left, width, bins, length)


def _pixel_major(
    windows: list[np.ndarray],
    offsets: np.ndarray,
    crop: tuple[int, int] | None,
    length: int,
    width: int,
    frames: int,
    bins: int,
) -> Deferred:
    return PixelVoxels(crop_pixels(windows, offsets, crop, length), frames, bins, length)


# bit order -> the batch's deferred voxel grid from the records' windows (views), crops, clip
# length, width, stored frames and bins
VOXELS: dict[
    str,
    Callable[[list[np.ndarray], np.ndarray, tuple[int, int] | None, int, int, int, int], Deferred],
] = {FRAME_MAJOR: _frame_major, PIXEL_MAJOR: _pixel_major}


@register_sample_type
class Spike(SampleType):
    name = "spike"

    def __init__(
        self,
        num_bins: int | None = None,
        clip_len: int | None = None,
        crop: tuple[int, int] | list[int] | None = None,
        images: list[str] | tuple[str, ...] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.num_bins = None if num_bins is None else int(num_bins)
        self.clip_len = None if clip_len is None else int(clip_len)
        self.crop = None if crop is None else (int(crop[0]), int(crop[1]))
        self.images = None if images is None else list(images)
        if (self.num_bins is not None and self.num_bins < 1) or (
            self.clip_len is not None and self.clip_len < 1
        ):
            raise ValueError("num_bins and clip_len must be >= 1")
        if self.crop is not None and min(self.crop) < 1:
            raise ValueError(f"crop must be (h, w) with h, w >= 1, got {crop}")

    def options(self) -> dict[str, Any]:
        return {
            "num_bins": self.num_bins,
            "clip_len": self.clip_len,
            "crop": None if self.crop is None else list(self.crop),
            "images": self.images,
        }

    def fields(self, index: Index) -> list[str]:
        stored = list(index.section("spike").get("images", []))
        images = stored if self.images is None else self.images
        return [SAMPLE_ID, SPIKES, SEQUENCE, FRAME, *images]

    def check(self, index: Index) -> None:
        sec = index.section("spike")
        built = int(sec.get("clip_len", 1))
        if self.clip_len is not None and self.clip_len != built:
            raise ValueError(
                f"{index.root} was built with [spike] clip_len = {built}; clips are a shard table, so "
                f"clip_len={self.clip_len} needs a rebuild with [spike] clip_len = {self.clip_len}"
            )
        missing = [i for i in (self.images or []) if i not in sec.get("images", [])]
        if missing:
            raise ValueError(f"{index.root} stores images {sec.get('images', [])}, not {missing}")
        frames, bins = stored_frames(index), self.num_bins or int(sec.get("num_bins", 1))
        if frames % bins:
            raise ValueError(
                f"num_bins={bins} does not divide the {frames} stored frames of {index.root} "
                f"(choose a divisor of {frames})"
            )
        height, width = int(sec["height"]), int(sec["width"])
        if self.crop is not None and (self.crop[0] > height or self.crop[1] > width):
            raise ValueError(f"crop {self.crop} is larger than the {height}x{width} spike frames")
        super().check(index)

    @property
    def tables(self) -> tuple[str, ...]:  # type: ignore[override]
        return (CLIPS,) if (self._built_clip or 1) > 1 else ()

    _built_clip: int | None = None
    bit_order: str = FRAME_MAJOR  # set by bind: the dataset's stored bit order and window frames
    frames: int = 0

    def bind(self, index: Index) -> None:
        sec = index.section("spike")
        self._built_clip = int(sec.get("clip_len", 1))
        self.num_bins = self.num_bins or int(sec.get("num_bins", 1))
        self.clip_len = self._built_clip
        self.size = (int(sec["height"]), int(sec["width"]))
        self.bit_order, self.frames = bit_order(index), stored_frames(index)
        self.image_names = [f for f in self.fields(index)[4:]]

    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        if CLIPS in columns:
            return columns[CLIPS].astype(np.int64)
        return np.arange(columns[SAMPLE_ID].shape[0], dtype=np.int64)[:, None]

    def check_columns(self, columns: Mapping[str, np.ndarray], name: str) -> None:
        clips = columns.get(CLIPS)
        if clips is not None and clips.size:
            seq = columns[SEQUENCE][clips]
            if not (seq == seq[:, :1]).all():
                raise FormatError(f"{name}: a clip crosses sequences")

    def assemble(self, batch: BatchRows) -> Payload:
        rows, b, length = batch.rows(), batch.size, batch.units.shape[1]
        offsets = crop_offsets(batch.seed, batch.epoch, batch.unit_ids, self.size, self.crop)
        p = Payload()
        # views: only the crops are copied
        windows = [arena.columns[SPIKES][r] for arena, r in rows.arena_rows()]
        width = self.crop[1] if self.crop is not None else self.size[1]
        p.xs["voxel"] = VOXELS[self.bit_order](
            windows, offsets, self.crop, length, width, self.frames, int(self.num_bins or 1)
        )
        for key in (SAMPLE_ID, SEQUENCE, FRAME):
            p.arrays[key] = rows.take(key).astype(np.int64).reshape(b, length)
        p.arrays["crop"] = offsets
        for name in self.image_names:
            p.arrays[name] = self._images(rows.take(name), offsets, b, length)
        return p

    def _images(self, img: np.ndarray, offsets: np.ndarray, b: int, length: int) -> np.ndarray:
        """Images ``[B*L, C, H', W']`` cropped where the spikes were (scaled), as float32 in [0, 1]."""
        if self.crop is None:
            return (img.astype(np.float32) / 255.0).reshape(b, length, *img.shape[1:])
        sy, sx = img.shape[2] / self.size[0], img.shape[3] / self.size[1]
        h, w = round(self.crop[0] * sy), round(self.crop[1] * sx)
        out = np.empty((b, length, img.shape[1], h, w), np.float32)
        for i in range(b):
            # offset and size are rounded apart (x.5 rounds to even): clamp so the window stays
            # inside
            y = min(round(int(offsets[i, 0]) * sy), img.shape[2] - h)
            x = min(round(int(offsets[i, 1]) * sx), img.shape[3] - w)
            out[i] = img[i * length : (i + 1) * length, :, y : y + h, x : x + w] / np.float32(255.0)
        return out
