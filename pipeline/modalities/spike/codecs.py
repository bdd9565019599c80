"""How the spike kind stores its spikes column, per ``[spike] codec`` choice: the column's own
codec and its bit order, and what each bit order means (written into index.json).

Apart from the manifest section (:mod:`.config`, which offers these names as choices) because it
is the writer's table: the pack and the index read it.
"""

from __future__ import annotations

from typing import Any

from loaders.modalities.spike.ops import FRAME_MAJOR, PIXEL_MAJOR

# [spike] codec -> (the spikes column's own codec, its bit order). "spikebits" (default): the window
# stored pixel-major (loaders.modalities.spike.ops) + zstd 5, ~0.55 of the bits' size, voxels by
# popcount; "spikebits-v1" (the previous default): frame-major column, the pixel-major transpose
# inside the codec (loaders.modalities.spike.bits), undone on every read; "dataset": frame-major
# with the [dataset] codec like every other column (e.g. "none"). The frame-major options keep the
# column as the camera writes it (and a plain "dataset" index at version 2).
SPIKE_CODECS: dict[str, tuple[dict[str, Any] | None, str]] = {
    "spikebits": ({"id": "zstd", "level": 5}, PIXEL_MAJOR),
    "spikebits-v1": ({"id": "shardsmith.spikebits", "level": 5}, FRAME_MAJOR),
    "dataset": (None, FRAME_MAJOR),
}
BITS = {
    PIXEL_MAJOR: "byte [y, x, k] = frames 8k..8k+7 of pixel (y, x), LSB first; rows top to bottom",
    FRAME_MAJOR: "1 bit per pixel, LSB first along width, rows top to bottom",
}
