"""Seeds and stable draws shared by every planner: a decision depends on (seed, names), never on
order."""

from __future__ import annotations

import hashlib

import numpy as np


def stable_unit(seed: int, *names: str) -> float:
    """A uniform number in [0, 1) that depends only on the seed and the names."""
    h = hashlib.blake2b("\x1f".join((str(seed), *names)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64


def source_rng(seed: int, source: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([seed, source, purpose])
