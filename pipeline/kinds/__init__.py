"""Dataset kinds (``[dataset] kind``): a registry; built-in kinds register on first lookup."""

from __future__ import annotations

from pipeline.kinds.base import (
    KINDS,
    Kind,
    KindPlan,
    PackResult,
    PlanContext,
    ShardPlan,
    Task,
    get_kind,
    kind_names,
    register_kind,
)

__all__ = ["KINDS", "Kind", "KindPlan", "PackResult", "PlanContext", "ShardPlan", "Task", "get_kind", "kind_names",
           "register_kind"]
