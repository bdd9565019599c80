"""CT volumes as sparse voxels, read side: sample type ``ct`` and its ``ct_coords`` op, registered
lazily.

``BUILD_MODULE`` is the build side (kind ``ct``, the ``.npy`` source), which a reader never imports.
"""

from __future__ import annotations

from loaders.samples import SAMPLE_TYPES
from loaders.samples.ops import OPS

SAMPLE_TYPES.register_lazy("ct", f"{__name__}.samples")
OPS.register_lazy("ct_coords", f"{__name__}.ops")

BUILD_MODULE = "pipeline.modalities.ct"
