"""``shardsmith.spikebits`` as a zarr v3 bytes-to-bytes codec, so a zarr shard's array names it in
its ``zarr.json`` (``{"name": "shardsmith.spikebits", "configuration": {"level": 5}}``) and zarr
decodes chunks through it. A zarr without this module imported refuses the array (unknown codec)
instead of misreading it.

The chunk's shape (records, frames, bytes of a frame) comes from zarr's chunk spec; the work is
:class:`loaders.modalities.spike.bits.SpikeBits`. Importing this module registers the codec with
zarr.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.codec import BytesBytesCodec
from zarr.core.common import parse_named_configuration
from zarr.registry import register_codec

from loaders.modalities.spike.bits import CODEC_ID, LEVEL, SpikeBits

if TYPE_CHECKING:
    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer


@dataclass(frozen=True)
class SpikeBitsZarrCodec(BytesBytesCodec):
    is_fixed_size = False
    level: int = LEVEL

    def __init__(self, *, level: int = LEVEL) -> None:
        object.__setattr__(self, "level", SpikeBits(level).level)  # validates

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpikeBitsZarrCodec:
        _, config = parse_named_configuration(data, CODEC_ID)
        return cls(**(config or {}))

    def to_dict(self) -> dict[str, Any]:
        return {"name": CODEC_ID, "configuration": {"level": self.level}}

    def _encode_sync(self, chunk: Buffer, spec: ArraySpec) -> Buffer:
        shape = tuple(spec.shape)
        a = (
            chunk.as_numpy_array()
            .view(np.uint8)
            .reshape(shape[0], shape[1] if len(shape) > 1 else 1, -1)
        )
        return spec.prototype.buffer.from_bytes(SpikeBits(self.level).encode(a))

    def _decode_sync(self, chunk: Buffer, spec: ArraySpec) -> Buffer:
        out = SpikeBits(self.level).decode(chunk.as_numpy_array())
        expected = int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.to_native_dtype().itemsize
        if out.nbytes != expected:
            raise ValueError(
                f"{CODEC_ID}: chunk decodes to {out.nbytes} bytes, the array's chunk holds {expected}"
            )
        return spec.prototype.buffer.from_array_like(out.reshape(-1))

    async def _encode_single(self, chunk: Buffer, spec: ArraySpec) -> Buffer:
        return await asyncio.to_thread(self._encode_sync, chunk, spec)

    async def _decode_single(self, chunk: Buffer, spec: ArraySpec) -> Buffer:
        return await asyncio.to_thread(self._decode_sync, chunk, spec)

    def compute_encoded_size(self, _input_byte_length: int, _chunk_spec: ArraySpec) -> int:
        raise NotImplementedError


register_codec(CODEC_ID, SpikeBitsZarrCodec)
