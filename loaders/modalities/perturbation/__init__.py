"""Single-cell perturbation screens, read side: sample types ``cells``, ``pairs`` and ``sentences``,
and the deferred ops of their expression rows (dense, scattered, torch sparse:
:mod:`.ops`).

Importing this module registers them lazily (``samples``, ``ops`` and ``torch_ops`` are imported
on first use); ``FORMAT_KEYS`` are its column and table names (:mod:`.keys`), which
``loaders.format`` answers by name; ``BUILD_MODULE`` is the build side (kind, sources, planner,
demo), which a reader never imports.
"""

from __future__ import annotations

from loaders.format import INDEX_UPGRADES
from loaders.modalities.perturbation.keys import FORMAT_KEYS  # noqa: F401 (loaders.plugins)
from loaders.samples import SAMPLE_TYPES
from loaders.samples.ops import LAYOUT_ITEMS, OPS, TORCH_OPS

for _name in ("cells", "pairs", "sentences"):
    SAMPLE_TYPES.register_lazy(_name, f"{__name__}.samples")
for _op in ("csr_dense", "scatter_dense", "csr_sparse"):
    OPS.register_lazy(_op, f"{__name__}.ops")
    TORCH_OPS.register_lazy(_op, f"{__name__}.torch_ops")
LAYOUT_ITEMS.register_lazy("csr", f"{__name__}.ops")
INDEX_UPGRADES.register_lazy("1", f"{__name__}.legacy")  # version-1 indexes held this modality only

BUILD_MODULE = "pipeline.modalities.perturbation"
