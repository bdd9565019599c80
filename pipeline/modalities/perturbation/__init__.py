"""Single-cell perturbation screens, build side: kind ``perturbation``, sources ``h5ad`` and
``h5csr``, the ``export`` command and the demo screens. Registered lazily: importing this module
imports none of them.
"""

from __future__ import annotations

from pipeline.commands import COMMANDS
from pipeline.commands.demo import DEMO_WRITERS
from pipeline.model import KINDS
from pipeline.report import register_report_section
from pipeline.source import SOURCES

_HERE = __name__
KINDS.register_lazy("perturbation", f"{_HERE}.kind")
KINDS.set_default("perturbation")  # manifests written before kinds existed name none
SOURCES.register_lazy("h5ad", f"{_HERE}.h5ad")
SOURCES.register_lazy("h5csr", f"{_HERE}.h5csr")
COMMANDS.register("export", f"{_HERE}.export_command")
DEMO_WRITERS.register("perturbation", f"{_HERE}.demo:write_perturbation_demo")
register_report_section("perturbation", f"{_HERE}.report:perturbation_section")
