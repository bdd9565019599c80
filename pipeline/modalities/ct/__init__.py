"""CT volumes, build side: kind ``ct``, source ``npy`` and the demo chests (registered lazily: the kind
imports scipy.ndimage, which no other build pays for)."""

from __future__ import annotations

from pipeline.commands.demo import DEMO_WRITERS
from pipeline.model import KINDS
from pipeline.source import SOURCES

_HERE = __name__
KINDS.register_lazy("ct", f"{_HERE}.kind")
SOURCES.register_lazy("npy", f"{_HERE}.npy")
DEMO_WRITERS.register("ct", f"{_HERE}.demo:write_ct_demo")
