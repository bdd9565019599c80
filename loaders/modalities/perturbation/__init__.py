"""Single-cell perturbation screens, read side: sample types ``cells``, ``pairs`` and ``sentences``.

Importing this module registers them; ``BUILD_MODULE`` is the build side (kind, sources, planner, demo).
"""

from __future__ import annotations

from loaders.modalities.perturbation import samples as samples  # registers cells, pairs, sentences

BUILD_MODULE = "pipeline.modalities.perturbation"
