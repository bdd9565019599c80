"""CT volumes as sparse voxels, read side: sample type ``ct`` and its ``ct_coords`` op.

Importing this module registers them; ``BUILD_MODULE`` is the build side (kind ``ct``, ``.npy`` source).
"""

from __future__ import annotations

from loaders.modalities.ct import ops as ops  # registers ct_coords
from loaders.modalities.ct import samples as samples  # registers ct

BUILD_MODULE = "pipeline.modalities.ct"
