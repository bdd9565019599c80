"""Sample types of single-cell perturbation screens: ``cells``, ``pairs`` and ``sentences``.

Their units: a primary cell (duplicated controls are stored for pairing but not counted), a row of the
``pairs`` table (control, perturbed), a row of the ``sentences`` tables (L perturbed cells of one group, then
L matched controls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from loaders.format import (
    COND_ID,
    OBS_PREFIX,
    OBSM_PREFIX,
    PAIRS,
    PRIMARY,
    SAMPLE_ID,
    SENTENCES_CTRL,
    SENTENCES_PERT,
    Index,
    X,
)
from loaders.samples.base import SampleType, register_sample_type

if TYPE_CHECKING:
    from loaders.gather import BatchRows
    from loaders.payload import Payload


def primary_rows(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Local rows counted in an epoch: the ``primary`` ones, or all rows when the field is absent."""
    if PRIMARY in columns:
        return np.flatnonzero(columns[PRIMARY]).astype(np.int64)
    n = next(iter(columns.values())).shape[0] if columns else 0
    return np.arange(n, dtype=np.int64)


class _CellSamples(SampleType):
    """Shared by the three single-cell sample types."""

    def fields(self, index: Index) -> list[str]:
        names = {f.name for f in index.fields}
        wanted = [X, SAMPLE_ID, PRIMARY, COND_ID, *(OBS_PREFIX + f for f in index.obs_fields)]
        return [n for n in wanted if n in names or n == X] + sorted(n for n in names if n.startswith(OBSM_PREFIX))

    def assemble(self, batch: BatchRows) -> Payload:  # TODO(loader helper): move dataset.make_batch here
        raise NotImplementedError


@register_sample_type
class Cells(_CellSamples):
    name = "cells"

    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return primary_rows(columns)[:, None]


@register_sample_type
class Pairs(_CellSamples):
    name = "pairs"
    tables = (PAIRS,)

    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return columns[PAIRS].astype(np.int64).reshape(-1, 2)


@register_sample_type
class Sentences(_CellSamples):
    name = "sentences"
    tables = (SENTENCES_PERT, SENTENCES_CTRL)

    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([columns[SENTENCES_PERT], columns[SENTENCES_CTRL]], axis=1).astype(np.int64)
