"""Spike-camera windows, read side: sample type ``spike``, its voxel ops and the
``shardsmith.spikebits`` field codec, each registered lazily (their modules are imported on first
use: numcodecs alone costs ~0.2 s).

``BUILD_MODULE`` is the build side (kind ``spike``, the ``.dat`` source), which a reader never
imports.
"""

from __future__ import annotations

from loaders.format.codecs import register_field_codec
from loaders.samples import SAMPLE_TYPES
from loaders.samples.ops import OPS

SAMPLE_TYPES.register_lazy("spike", f"{__name__}.samples")
OPS.register_lazy("spike_voxel", f"{__name__}.samples")
OPS.register_lazy("spike_voxel_pixel_major", f"{__name__}.ops")
register_field_codec("shardsmith.spikebits", f"{__name__}.bits", f"{__name__}.bits_zarr")

BUILD_MODULE = "pipeline.modalities.spike"
