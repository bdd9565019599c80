"""Split codes and the fraction rule, shared by the split rules and the cell-load assignment."""

from __future__ import annotations

import numpy as np

TRAIN, VAL, TEST = 0, 1, 2
DROPPED = (
    -1
)  # not used by the split rules (a cell-load experiment's unlisted cell types): not packed
SPLIT_NAMES = ("train", "val", "test")


def _by_fraction(u: np.ndarray, val: float, test: float) -> np.ndarray:
    return np.where(u < test, TEST, np.where(u < test + val, VAL, TRAIN)).astype(np.int8)
