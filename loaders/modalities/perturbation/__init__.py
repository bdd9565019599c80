"""Single-cell perturbation screens, read side: sample types ``cells``, ``pairs`` and ``sentences``.

Importing this module registers them lazily (``samples`` is imported on first use); ``BUILD_MODULE`` is the
build side (kind, sources, planner, demo), which a reader never imports.
"""

from __future__ import annotations

from loaders.samples import SAMPLE_TYPES

for _name in ("cells", "pairs", "sentences"):
    SAMPLE_TYPES.register_lazy(_name, f"{__name__}.samples")

BUILD_MODULE = "pipeline.modalities.perturbation"
