"""Spike-camera windows, read side: sample type ``spike``, its voxel ops and the ``shardsmith.spikebits``
field codec (imported only when a dataset names it: numcodecs costs ~0.2 s).

Importing this module registers them; ``BUILD_MODULE`` is the build side (kind ``spike``, ``.dat`` source).
"""

from __future__ import annotations

from loaders.fieldcodecs import register_field_codec
from loaders.modalities.spike import ops as ops  # registers spike_voxel_pixel_major
from loaders.modalities.spike import samples as samples  # registers spike, spike_voxel

register_field_codec("shardsmith.spikebits", "loaders.modalities.spike.bits", "loaders.modalities.spike.bits_zarr")

BUILD_MODULE = "pipeline.modalities.spike"
