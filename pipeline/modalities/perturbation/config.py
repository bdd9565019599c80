"""The perturbation kind's manifest sections: ``[fields]``, ``[pairing]``, ``[split]`` (typed,
validated)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.errors import ManifestError
from pipeline.modalities.perturbation.experiment import load_experiment
from pipeline.modalities.perturbation.split_config import Split, parse_split, refuse_decided
from pipeline.schema import key, or_none

STRATEGIES = ("batch", "random")
VALUE_KINDS = ("counts", "any")
MAX_SENTENCE = 8192  # a sentence is padded to its size: 10**7 slots per group would allocate GBs
STANDARD_FIELDS = ("perturbation", "cell_type", "batch")  # the obs fields [fields] names
NUMERIC_TRANSFORMS = ("log1p", "none")  # how a numeric covariate enters the condition vector


@dataclass(frozen=True)
class Fields:
    """[fields]: which obs columns hold the perturbation, its controls and the covariates."""

    perturbation: str = key("string", "perturbation", doc="the obs column of perturbation labels")
    control: tuple[str, ...] = key(
        "strings",
        ("control",),
        min_items=1,
        fix='list the perturbation label of control cells, e.g. control = ["non-targeting"]',
    )
    cell_type: str | None = key("string", None, convert=or_none, doc='"": no cell type column')
    batch: str | None = key("string", None, convert=or_none, doc='"": no batch column')
    covariates: tuple[str, ...] = key("names", (), doc="obs columns one-hot in the condition")
    combination_separator: str | None = key(
        "string", None, convert=or_none, doc='"_": "A_B" is the sum of the vectors of A and B'
    )
    numeric_covariates: tuple[str, ...] = key("names", (), doc="obs columns entered as numbers")
    numeric_transform: str = key("string", "log1p", choices=NUMERIC_TRANSFORMS)
    matrix: str = key("string", "X", doc="the matrix read: X or a layer")
    values: str = key("string", "any", choices=VALUE_KINDS, doc='"counts": negatives are an error')
    obsm: tuple[str, ...] = key("names", (), doc="obsm keys stored with each cell")
    perturbation_features: Path | None = key("string", None, doc=".npy/.npz/.csv, one row each")

    @property
    def obs_fields(self) -> tuple[str, ...]:
        """Logical obs fields in condition-vector order (perturbation, cell_type, batch,
        covariates...)."""
        named = tuple(f for f in STANDARD_FIELDS if f == "perturbation" or getattr(self, f))
        return named + self.covariates + self.numeric_covariates

    def column(self, logical: str) -> str:
        """The source obs column holding a logical field (covariates are their own column name)."""
        return (getattr(self, logical) or "") if logical in STANDARD_FIELDS else logical


@dataclass(frozen=True)
class Pairing:
    """[pairing]: how perturbed cells are matched with controls into sentences."""

    strategy: str = key("string", "batch", choices=STRATEGIES)
    max_pairs_per_condition: int = key("integer", 500, minimum=0)
    sentence_size: int = key(
        "integer",
        128,
        minimum=1,
        maximum=MAX_SENTENCE,
        fix="cells per sentence (STATE uses 128-512): every sentence stores this many slots",
    )


@dataclass(frozen=True)
class PerturbationConfig:
    fields: Fields
    pairing: Pairing
    split: Split


def parse_sections(path: Path, sections: Mapping[str, Any]) -> PerturbationConfig:
    """The checked ``[fields]``, ``[pairing]`` and ``[split]`` tables, and their cross-checks."""
    fields = Fields(**sections["fields"])
    features = fields.perturbation_features
    if features is not None:
        fpath = (path.parent / features).resolve()
        if fpath.suffix not in (".npy", ".npz", ".csv"):
            raise ManifestError(
                path, "fields.perturbation_features", "must be .npy, .npz or .csv (never pickle)"
            )
        if not fpath.exists():
            raise ManifestError(path, "fields.perturbation_features", f"file not found: {fpath}")
        fields = replace(fields, perturbation_features=fpath)
    _check_covariates(path, fields)
    data = sections["split"]
    experiment = None
    if data["cellload_toml"] is not None:
        refuse_decided(path, data)
        experiment = load_experiment(path, data["cellload_toml"])
    split = parse_split(path, data, experiment)
    check_fields(path, fields, split)
    return PerturbationConfig(fields, Pairing(**sections["pairing"]), split)


def check_fields(path: Path, fields: Fields, split: Split) -> None:
    """Settings that contradict each other, named with the fix (a column both one-hot and numeric
    is :func:`_check_covariates`'s: "already a field"), and explicit zero-shot lists: a cell type
    is held out for one split only."""
    if split.combinations != "any" and fields.combination_separator is None:
        raise ManifestError(
            path,
            "split.combinations",
            'needs fields.combination_separator (e.g. "_" for '
            'scPerturb\'s "AHR_KLF1") to know which perturbations are combinations',
        )
    if fields.cell_type is None and (split.mode == "zeroshot" or split.fewshot or split.experiment):
        raise ManifestError(
            path,
            "fields.cell_type",
            "the split holds out cell types: name the obs column that "
            'holds them (scPerturb: "celltype")',
        )

    both = sorted(set(split.val_cell_types or ()) & set(split.test_cell_types or ()))
    if both:  # else test silently wins
        raise ManifestError(
            path,
            "split.test_cell_types",
            f"{both} also in split.val_cell_types: hold each cell "
            "type out for val or for test, not both",
        )


def _check_covariates(path: Path, fields: Fields) -> None:
    """A covariate is an extra obs field: one named like a standard field (or twice) would be two
    condition columns with one name."""
    taken = set(STANDARD_FIELDS)  # "batch" even when unset: Fields.column maps it
    for k, name in [
        *(("covariates", c) for c in fields.covariates),
        *(("numeric_covariates", c) for c in fields.numeric_covariates),
    ]:
        if name in taken:
            raise ManifestError(
                path,
                f"fields.{k}",
                f"{name!r} is already a field ({', '.join(sorted(taken))} "
                "and the covariates before it): list each extra obs column once, none of those",
            )
        taken.add(name)
