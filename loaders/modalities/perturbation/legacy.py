"""Version-1 indexes, written when shardsmith built perturbation datasets only: upgraded to the
current layout on read (unit counts from primary / pairs / sentences, part numbers from file
names, the top-level perturbation settings moved into the kind's section)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loaders.format import INDEX_UPGRADES

V1_SECTION_KEYS = (
    "pairing",
    "split",
    "var_names",
)  # v1 kept these perturbation settings at the top level
V1_UNIT_TABLES = (("pairs", "pairs"), ("sentences", "sentences/pert"))  # v1: (sample, its table)


def from_v1(raw: Mapping[str, Any]) -> dict[str, Any]:
    """An index.json of version 1 (perturbation only, shards written by the same shard layout) in
    the version-2 layout: unit counts from primary/pairs/sentences, part numbers from file names."""
    doc = dict(raw)
    tables = list(raw.get("tables", []))
    samples = ["cells"] + [s for s, t in V1_UNIT_TABLES if t in tables]
    shards = []
    for s in raw["shards"]:
        units = {
            "cells": s["primary"],
            "pairs": s.get("pairs", 0),
            "sentences": s.get("sentences", 0),
        }
        parts = str(s["file"]).split("-")
        part = int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else 0
        shards.append(
            {**s, "units": {k: v for k, v in units.items() if k in samples}, "part": part}
        )
    doc["shards"], doc["samples"] = shards, samples
    doc["sections"] = {str(raw["kind"]): {k: raw[k] for k in V1_SECTION_KEYS if k in raw}}
    doc["primary_records"] = (raw.get("stats") or {}).get("cells")
    return doc


INDEX_UPGRADES.register("1", from_v1)
