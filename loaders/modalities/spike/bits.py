"""``shardsmith.spikebits``: a lossless codec for bit-packed spike windows, pixel-major bits then
zstd.

Why: a spike camera integrates and fires, so each pixel fires nearly periodically (period ~
1/intensity) at its own phase. Stored as the camera writes them (time-major: one byte = 8
neighbouring pixels of one frame) the bits look random to a byte codec (zstd: 0.87 of their size,
lz4: 1.0). Transposed so that one byte holds 8 consecutive frames of ONE pixel and each pixel's
bytes are contiguous, the periodic patterns repeat byte for byte and zstd stores them at ~0.55 of
their size (docs/SPIKE.md, "Codec"). Decoding is numpy on whole chunks: zstd, then an 8x8
bit-matrix transpose on uint64 words (three mask-and-shift rounds), ~1 GB/s of packed bits.

The logical column is unchanged: uint8 ``[n, T, *frame]`` (``T`` frames of ``prod(frame)`` bytes
each; for spike shards ``[n, T, H, ceil(W/8)]``), so the loader, the voxel op and the GPU path
never see the codec. That is also its cost: every read transposes back to frame-major bits.
Default spike builds now store the column pixel-major instead (``loaders.modalities.spike.ops``:
the same bytes on disk, plain zstd, voxels by popcount without any transpose); this codec is
``[spike] codec = "spikebits-v1"``, kept so its shards still read and for comparison.

Stream: a 16-byte header (``b"SPKB"``, format version, ``n``, ``T``, bytes per frame ``R``;
little endian), then one zstd frame of the transposed bytes ``[n, R, 8, ceil(T/8)]`` (frames past
``T`` are zero padding). The header makes a stream self-describing: decoding needs no config, and
a stream of another codec is refused. Same input, level and zstd build -> same bytes (zstd is
deterministic). One zstd frame per chunk (per-record frames stored ~5% more); decoding transposes
record by record through a few reused half-MB buffers, straight into the caller's buffer when
given one (zarr's chunks are 16 windows, 8 MB: whole-chunk temporaries fall out of cache; on the
loaded 2-core machine the gain measured between 0 and 2x, interleaved A/B).

Registered with numcodecs (``numcodecs.get_codec({"id": "shardsmith.spikebits", "level": 5})``),
with the shard encodings' field-codec registry (``loaders.format.codecs``), and for zarr v3 in
``loaders.modalities.spike.bits_zarr``.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray, ndarray_copy
from numcodecs.registry import register_codec
from numcodecs.zstd import Zstd

CODEC_ID = "shardsmith.spikebits"
# zstd level: 3 stores ~7% more and encodes 4x faster; 9 saves ~1% more at 2.5x the encode time
LEVEL = 5
MAGIC, STREAM_VERSION = b"SPKB", 1
_HEADER = struct.Struct("<4sB3xIII")  # magic, version, n records, T frames, R bytes per frame
# 8x8 bit-matrix transpose of a little-endian uint64 (byte j = row j, bit i = column i): Hacker's
# Delight 7-3.
_ROUNDS = tuple(
    (np.uint64(m), np.uint64(s))
    for m, s in ((0x00AA00AA00AA00AA, 7), (0x0000CCCC0000CCCC, 14), (0x00000000F0F0F0F0, 28))
)


def transpose8(words: np.ndarray, t: np.ndarray | None = None) -> np.ndarray:
    """Transpose the 8x8 bit matrix of every little-endian uint64 in place (and return it); ``t``:
    scratch."""
    t = np.empty_like(words) if t is None else t
    for m, s in _ROUNDS:
        np.right_shift(words, s, out=t)
        t ^= words
        t &= m
        words ^= t
        t <<= s
        words ^= t
    return words


def to_pixel_major(a: np.ndarray) -> np.ndarray:
    """uint8 ``[n, T, R]`` (time-major frames of R bytes) -> ``[n, R, 8, K]`` with ``K =
    ceil(T/8)``: byte ``[r, i, k]`` holds frames ``8k .. 8k+7`` (LSB first) of bit ``i`` of byte
    ``r`` of a frame."""
    n, t, r = a.shape
    k = -(-t // 8)
    if t != 8 * k:
        a = np.concatenate([a, np.zeros((n, 8 * k - t, r), np.uint8)], axis=1)
    words = np.ascontiguousarray(a.reshape(n, k, 8, r).transpose(0, 1, 3, 2)).view(
        "<u8"
    )  # [n, K, R, 1]
    blocks = transpose8(words).view(np.uint8).reshape(n, k, r, 8)
    return np.ascontiguousarray(blocks.transpose(0, 2, 3, 1))


def from_pixel_major(p: np.ndarray, frames: int, out: np.ndarray | None = None) -> np.ndarray:
    """The inverse of :func:`to_pixel_major`: ``[n, R, 8, K]`` -> uint8 ``[n, frames, R]`` (into
    ``out``), one record at a time through reused buffers (``p`` may be read-only)."""
    n, r, _, k = p.shape
    out = np.empty((n, frames, r), np.uint8) if out is None else out
    words, tmp = np.empty((k, r, 8), np.uint8), np.empty((k, r), "<u8")
    rows = None if frames == 8 * k else np.empty((k, 8, r), np.uint8)
    for i in range(n):
        np.copyto(words, p[i].transpose(2, 0, 1))
        transpose8(words.view("<u8")[..., 0], tmp)  # now [K, R, 8 frames]
        if rows is None:
            np.copyto(out[i].reshape(k, 8, r), words.transpose(0, 2, 1))
        else:
            np.copyto(rows, words.transpose(0, 2, 1))
            out[i] = rows.reshape(8 * k, r)[:frames]
    return out


class SpikeBits(Codec):  # type: ignore[misc]
    """numcodecs codec: ``encode`` takes uint8 ``[n, T, ...]`` (records, frames, the bytes of a
    frame) and ``decode`` gives back its bytes (``[n, T, R]``; into ``out`` when given, any shape
    of the same size)."""

    codec_id = CODEC_ID

    def __init__(self, level: int = LEVEL) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 22:
            raise ValueError(f"{CODEC_ID}: level must be an integer in [1, 22], got {level!r}")
        self.level = level

    def get_config(self) -> dict[str, Any]:
        return {"id": CODEC_ID, "level": self.level}

    def encode(self, buf: Any) -> bytes:
        a = np.asarray(buf)
        if a.dtype != np.uint8 or a.ndim < 2:
            raise ValueError(
                f"{CODEC_ID} encodes uint8 [records, frames, ...], got {a.dtype}{list(a.shape)}"
            )
        n, t = a.shape[0], a.shape[1]
        r = int(np.prod(a.shape[2:], dtype=np.int64))
        pixels = to_pixel_major(np.ascontiguousarray(a).reshape(n, t, r))
        body = (
            bytes(Zstd(level=self.level).encode(pixels)) if pixels.size else b""
        )  # nothing: no zstd frame
        return _HEADER.pack(MAGIC, STREAM_VERSION, n, t, r) + body

    def decode(self, buf: Any, out: Any = None) -> Any:
        data = memoryview(
            np.frombuffer(buf, np.uint8) if not isinstance(buf, (bytes, bytearray)) else buf
        )
        n, t, r = read_header(data)
        k = -(-t // 8)
        size = n * r * 8 * k
        body = np.frombuffer(Zstd().decode(data[_HEADER.size :]) if size else b"", np.uint8)
        if body.size != size:
            raise ValueError(
                f"{CODEC_ID}: corrupt stream ({body.size} bytes decoded, header says {n * r * 8 * k})"
            )
        if out is not None:
            dest = ensure_contiguous_ndarray(out)
            if (
                dest.dtype == np.uint8 and dest.size == n * t * r
            ):  # straight into the caller's buffer
                from_pixel_major(body.reshape(n, r, 8, k), t, dest.reshape(n, t, r))
                return out
        dec = from_pixel_major(body.reshape(n, r, 8, k), t)
        return dec if out is None else ndarray_copy(dec, out)


def read_header(data: memoryview | bytes) -> tuple[int, int, int]:
    """``(n, T, R)`` of a stream; a stream that is not one (another codec, truncated) is a
    ValueError."""
    if len(data) < _HEADER.size:
        raise ValueError(f"{CODEC_ID}: stream of {len(data)} bytes is shorter than its header")
    magic, version, n, t, r = _HEADER.unpack(bytes(data[: _HEADER.size]))
    if magic != MAGIC:
        raise ValueError(f"{CODEC_ID}: not a spikebits stream (starts with {bytes(magic)!r})")
    if version != STREAM_VERSION:
        raise ValueError(
            f"{CODEC_ID}: stream version {version}; this shardsmith reads {STREAM_VERSION} "
            "(upgrade shardsmith)"
        )
    return n, t, r


register_codec(SpikeBits)
