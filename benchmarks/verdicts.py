"""One row of the targets table: a figure against its goal, met or missed and by how much. Its own
module so that the first five targets (targets.py) and the later ones (targets_extra.py) both use
it without importing each other (targets.py adds the later rows to its own)."""

from __future__ import annotations

from typing import Any


def target(
    name: str,
    what: str,
    value: float | None,
    goal: float,
    higher_is_better: bool,
    unit: str = "x",
    detail: str = "",
) -> dict[str, Any]:
    if value is None:
        return {
            "name": name,
            "what": what,
            "status": "not measured",
            "value": None,
            "goal": goal,
            "detail": detail,
        }
    met = value >= goal if higher_is_better else value <= goal
    if met:
        margin = value / goal if higher_is_better else goal / max(value, 1e-12)
        by = f"met, {margin:.2f}x margin"
    else:
        by = (
            f"missed: {goal / max(value, 1e-12):.2f}x short"
            if higher_is_better
            else f"missed: {value / goal:.2f}x the limit"
        )
    return {
        "name": name,
        "what": what,
        "status": "met" if met else "missed",
        "value": value,
        "goal": goal,
        "unit": unit,
        "by": by,
        "detail": detail,
        "higher_is_better": higher_is_better,
    }
