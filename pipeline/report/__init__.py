"""`shardsmith report`: one offline HTML page per dataset, its figures' data as JSON beside it, and a
MultiQC custom-content file.

Why a registry: each modality knows what a person wants to see of its datasets (cells per
perturbation, kept voxels, spike rates), so each contributes its own section, registered by kind
name as ``"module:function"`` (as the demo writers are); a plug-in registers one the same way from
its build module, and a kind that registers none gets the generic part only (the summary table,
splits, skipped records, warnings). The numbers come from :func:`pipeline.verify.summary`, the
one source ``inspect`` prints, plus the shard columns a figure needs; nothing is recomputed twice.
"""

from __future__ import annotations

from loaders.plugins import load_build_modalities
from loaders.plugins.registry import Registry

# dataset kind -> "module:function" returning its report Section (pipeline.report.model)
REPORT_SECTIONS: Registry[str] = Registry("report section", discover=load_build_modalities)


def register_report_section(kind: str, target: str) -> None:
    """``target`` ("module:function", imported only when a report of a ``kind`` dataset is
    written) builds that kind's section from a :class:`pipeline.report.model.ReportContext`."""
    REPORT_SECTIONS.register(kind, target)
