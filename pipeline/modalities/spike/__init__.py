"""Spike-camera streams, build side: kind ``spike``, source ``dat`` and the demo corpus (registered
lazily)."""

from __future__ import annotations

from pipeline.commands.demo import DEMO_WRITERS
from pipeline.extras import register_extra
from pipeline.model import KINDS
from pipeline.report import register_report_section
from pipeline.source import SOURCES

_HERE = __name__
KINDS.register_lazy("spike", f"{_HERE}.kind")
SOURCES.register_lazy("dat", f"{_HERE}.dat")
DEMO_WRITERS.register("spike", f"{_HERE}.demo:write_spike_demo")
register_extra("PIL", "images", "Pillow", "spike datasets with paired images ([spike] images)")
register_report_section("spike", f"{_HERE}.report:spike_section")
