"""Sample types of single-cell perturbation screens: ``cells``, ``pairs`` and ``sentences``.

Their units: a primary cell (duplicated controls are stored for pairing but not counted), a row
of the ``pairs`` table (control, perturbed), a row of the ``sentences`` tables (L perturbed cells
of one group, then L matched controls). A batch carries ``X`` (dense float32 after transport),
the cells' ``sample_id``, ``cond_id`` and obs codes (int64: what embeddings and losses index
with), the condition vectors ``cond`` when the dataset has a condition table, and the
``obsm/<key>`` embeddings.

Load-time options (``ShardDataset(..., densify=False)`` passes them here): ``densify=False``
delivers the expression rows as their CSR parts (``X.crow``, ``X.cols``, ``X.vals``), and with
``torch_sparse=True`` as a torch sparse CSR tensor (:mod:`loaders.modalities.perturbation.ops`).
They change no batch's units, so a resume state ignores them (``delivery_options``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders.format import CONDITION_VECTORS, PRIMARY, SAMPLE_ID, FormatError, Index
from loaders.format.integrity import open_checked
from loaders.modalities.perturbation.keys import (
    COND_ID,
    OBS_NAMES,
    OBS_PREFIX,
    OBSM_PREFIX,
    PAIRS,
    SENTENCES_CTRL,
    SENTENCES_PERT,
    X,
)
from loaders.modalities.perturbation.ops import ROWS_AS, Gathered, form_of
from loaders.samples import SampleType, register_sample_type
from loaders.samples.payload import Payload

if TYPE_CHECKING:
    from loaders.samples.gather import BatchRows, Rows


def primary_rows(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """Local rows counted in an epoch: the ``primary`` ones, or all rows when the field is absent."""
    if PRIMARY in columns:
        return np.flatnonzero(columns[PRIMARY]).astype(np.int64)
    n = next(iter(columns.values())).shape[0] if columns else 0
    return np.arange(n, dtype=np.int64)


class _CellSamples(SampleType):
    """What the three single-cell sample types share: the fields, the condition table, the metadata,
    and how the expression rows are delivered (``densify``, ``torch_sparse``: see the module
    docstring)."""

    delivery_options = ("densify", "torch_sparse")
    record_names = OBS_NAMES

    def __init__(self, densify: bool = True, torch_sparse: bool = False, **options: Any) -> None:
        super().__init__(**options)
        self.densify, self.torch_sparse = bool(densify), bool(torch_sparse)
        # the Deferred class of the expression rows
        self.rows_as = ROWS_AS[form_of(self.densify, self.torch_sparse)]
        self.n_cols, self.obs_fields, self.obsm_keys = 0, [], []  # type: ignore[var-annotated]
        self.conditions_path: str | None = None
        self.conditions_digest = (
            ""  # the index's content hash of the table, checked when it is read
        )
        self.n_cond: int | None = None
        self.encoding, self.has_cond = "zarr", False
        self._vectors: np.ndarray | None = None
        self.int_keys: tuple[str, ...] = ()
        self.int_names: tuple[str, ...] = ()

    def options(self) -> dict[str, Any]:
        out: dict[str, Any] = {}  # only non-defaults: a default config stays {name, module}
        if not self.densify:
            out["densify"] = False
        if self.torch_sparse:
            out["torch_sparse"] = True
        return out

    def field_bounds(self, index: Index) -> dict[str, int]:
        """obs codes index their vocabulary: never one without a label, whatever a field's ``bound``
        says."""
        return {OBS_PREFIX + f: len(v) for f, v in index.vocabularies.items()}

    def expression(self, rows: Rows, shape: tuple[int, ...]) -> Gathered:
        """The expression rows of ``rows`` (dense ``shape`` when finished), in the form the options
        ask for."""
        return self.rows_as(*rows.csr_parts(X, int(shape[-1])), shape)

    @staticmethod
    def obs_of(index: Index) -> list[str]:
        """obs fields in condition-vector order (or, for an index that does not list them, by name)."""
        names = [f.name for f in index.fields]
        return list(index.obs_fields) or [
            n[len(OBS_PREFIX) :] for n in names if n.startswith(OBS_PREFIX)
        ]

    def fields(self, index: Index) -> list[str]:
        names = {f.name for f in index.fields}
        wanted = [X, SAMPLE_ID, PRIMARY, COND_ID, *(OBS_PREFIX + f for f in self.obs_of(index))]
        return [n for n in wanted if n in names or n in (X, SAMPLE_ID)] + sorted(
            n for n in names if n.startswith(OBSM_PREFIX)
        )

    def bind(self, index: Index) -> None:
        names = {f.name for f in index.fields}
        self.n_cols = index.field(X).shape[0]
        self.obs_fields = [f for f in self.obs_of(index) if OBS_PREFIX + f in names]
        self.obsm_keys = sorted(n for n in names if n.startswith(OBSM_PREFIX))
        self.has_cond = COND_ID in names
        # batch key -> field of the int64 metadata, gathered together (Rows.ints)
        self.int_keys = (("cond_id",) if self.has_cond else ()) + tuple(self.obs_fields)
        self.int_names = ((COND_ID,) if self.has_cond else ()) + tuple(
            OBS_PREFIX + f for f in self.obs_fields
        )
        cond = index.conditions
        self.conditions_path = (
            str(index.root / cond.file) if cond is not None and cond.file else None
        )
        self.conditions_digest = cond.digest if cond is not None else ""
        self.n_cond = cond.rows if cond is not None and cond.rows else None
        self.encoding = index.encoding

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_vectors": None}  # reloaded lazily in each process

    def vectors(self) -> np.ndarray | None:
        """The condition table's vectors (float32 [rows, dim]), loaded once per process."""
        if self._vectors is None and self.conditions_path is not None:
            # a zarr group (a folder) per the contract; tar-encoded builds write it in their own
            # encoding
            encoding = "zarr" if Path(self.conditions_path).is_dir() else self.encoding
            # checked like a shard (digest, every chunk present): a missing chunk would read as
            # zeros
            try:
                got = open_checked(
                    self.conditions_path, encoding, [CONDITION_VECTORS], self.conditions_digest
                )[CONDITION_VECTORS].read()
            except FormatError as e:
                raise FormatError(f"condition table: {e}") from None
            self._vectors = np.asarray(got, dtype=np.float32)
        return self._vectors

    def check_columns(self, columns: Mapping[str, np.ndarray], name: str) -> None:
        cid = columns.get(COND_ID)
        if (
            self.n_cond is not None
            and cid is not None
            and cid.size
            and cid.max(initial=0) >= self.n_cond
        ):
            raise FormatError(f"{name}: cond_id beyond the condition table's {self.n_cond} rows")

    def meta(self, p: Payload, rows: Rows) -> None:
        """cond_id, cond vectors and obs codes of ``rows`` (int64, all gathered at once:
        ``Rows.ints``)."""
        if not self.int_keys:
            return
        ints = rows.ints(self.int_names)
        for i, k in enumerate(self.int_keys):
            p.arrays[k] = ints[i]
        if self.has_cond:
            vectors = self.vectors()
            if vectors is not None:
                p.arrays["cond"] = vectors.take(ints[0], axis=0)


@register_sample_type
class Cells(_CellSamples):
    name = "cells"

    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return primary_rows(columns)[:, None]

    def assemble(self, batch: BatchRows) -> Payload:
        rows, b, p = batch.rows(0), batch.size, Payload()
        p.xs["X"] = self.expression(rows, (b, self.n_cols))
        p.arrays["sample_id"] = rows.take(SAMPLE_ID)
        self.meta(p, rows)
        for k in self.obsm_keys:
            p.arrays[k] = rows.take(k)
        return p


@register_sample_type
class Pairs(_CellSamples):
    name = "pairs"
    tables = (PAIRS,)

    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return columns[PAIRS].astype(np.int64).reshape(-1, 2)

    def count(self, columns: Mapping[str, np.ndarray]) -> int:
        return int(
            np.shape(columns[PAIRS])[0]
        )  # without building the units (the build counts every shard)

    def assemble(self, batch: BatchRows) -> Payload:
        ctrl, pert, b, p = batch.rows(0), batch.rows(1), batch.size, Payload()
        p.xs["x_ctrl"] = self.expression(ctrl, (b, self.n_cols))
        p.xs["x_pert"] = self.expression(pert, (b, self.n_cols))
        p.arrays["ctrl_id"] = ctrl.take(SAMPLE_ID)
        p.arrays["pert_id"] = pert.take(SAMPLE_ID)
        self.meta(p, pert)
        for k in self.obsm_keys:
            p.arrays[k] = pert.take(k)
        return p


@register_sample_type
class Sentences(_CellSamples):
    name = "sentences"
    tables = (SENTENCES_PERT, SENTENCES_CTRL)

    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([columns[SENTENCES_PERT], columns[SENTENCES_CTRL]], axis=1).astype(
            np.int64
        )

    def count(self, columns: Mapping[str, np.ndarray]) -> int:
        return int(
            np.shape(columns[SENTENCES_PERT])[0]
        )  # the units, ~40 slots per cell, are not built for it

    def check_columns(self, columns: Mapping[str, np.ndarray], name: str) -> None:
        super().check_columns(columns, name)
        if columns[SENTENCES_PERT].shape != columns[SENTENCES_CTRL].shape:
            raise FormatError(f"{name}: sentences/pert and sentences/ctrl differ in shape")

    def assemble(self, batch: BatchRows) -> Payload:
        b, p = batch.size, Payload()
        length = batch.units.shape[1] // 2
        pert, ctrl = batch.rows(slice(0, length)), batch.rows(slice(length, 2 * length))
        p.xs["x_pert"] = self.expression(pert, (b, length, self.n_cols))
        p.xs["x_ctrl"] = self.expression(ctrl, (b, length, self.n_cols))
        p.arrays["pert_id"] = pert.take(SAMPLE_ID).reshape(b, length)
        p.arrays["ctrl_id"] = ctrl.take(SAMPLE_ID).reshape(b, length)
        self.meta(p, batch.rows(0))
        for k in self.obsm_keys:
            p.arrays[k] = pert.take(k).reshape(b, length, -1)
        return p
