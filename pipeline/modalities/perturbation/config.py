"""The perturbation kind's manifest sections: ``[fields]``, ``[pairing]``, ``[split]`` (typed,
validated)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ManifestError
from pipeline.manifest import Table
from pipeline.modalities.perturbation.split_config import SPLIT_MODES, Split, parse_split

__all__ = ["SPLIT_MODES", "Fields", "Pairing", "PerturbationConfig", "Split", "parse_sections"]

STRATEGIES = ("batch", "random")
VALUE_KINDS = ("counts", "any")
MAX_SENTENCE = (
    8192  # a sentence is padded to its size: 10**7 slots per group would allocate gigabytes
)
NUMERIC_TRANSFORMS = ("log1p", "none")  # how a numeric covariate enters the condition vector


@dataclass(frozen=True)
class Fields:
    perturbation: str = "perturbation"
    control: tuple[str, ...] = ("control",)
    cell_type: str | None = None  # absent or "": the data has no cell type (one implicit group)
    batch: str | None = None  # absent or "": no batch column (pairs match on cell type only)
    covariates: tuple[str, ...] = ()
    combination_separator: str | None = None  # "_": "A_B" is the sum of the vectors of A and B
    numeric_covariates: tuple[
        str, ...
    ] = ()  # numbers in the condition vector (after numeric_transform)
    numeric_transform: str = "log1p"
    matrix: str = "X"
    values: str = "any"  # "counts": negative values are an error
    obsm: tuple[str, ...] = ()
    perturbation_features: Path | None = None

    @property
    def obs_fields(self) -> tuple[str, ...]:
        """Logical obs fields in condition-vector order (perturbation, cell_type, batch,
        covariates...)."""
        names = (
            ("perturbation",)
            + (("cell_type",) if self.cell_type else ())
            + (("batch",) if self.batch else ())
        )
        return names + self.covariates + self.numeric_covariates

    def column(self, logical: str) -> str:
        """The source obs column holding a logical field (covariates are their own column name)."""
        return {
            "perturbation": self.perturbation,
            "cell_type": self.cell_type or "",
            "batch": self.batch or "",
        }.get(logical, logical)


@dataclass(frozen=True)
class Pairing:
    strategy: str = "batch"
    max_pairs_per_condition: int = 500
    sentence_size: int = 128


@dataclass(frozen=True)
class PerturbationConfig:
    fields: Fields
    pairing: Pairing
    split: Split


def parse_sections(path: Path, sections: Mapping[str, Any]) -> PerturbationConfig:
    fl = Table(
        path,
        "fields",
        sections.get("fields") or {},
        {
            "perturbation",
            "control",
            "cell_type",
            "batch",
            "covariates",
            "matrix",
            "values",
            "obsm",
            "perturbation_features",
            "combination_separator",
            "numeric_covariates",
            "numeric_transform",
        },
    )
    pr = Table(
        path,
        "pairing",
        sections.get("pairing") or {},
        {"strategy", "max_pairs_per_condition", "sentence_size"},
    )

    matrix = fl.get("matrix", str, "X")
    features = fl.get("perturbation_features", str, None)
    if features is not None:
        fpath = (path.parent / features).resolve()
        if fpath.suffix not in (".npy", ".npz", ".csv"):
            raise ManifestError(
                path, "fields.perturbation_features", "must be .npy, .npz or .csv (never pickle)"
            )
        if not fpath.exists():
            raise ManifestError(path, "fields.perturbation_features", f"file not found: {fpath}")
    fields = Fields(
        perturbation=fl.get("perturbation", str, "perturbation"),
        control=fl.strings("control", ("control",)) or (),
        cell_type=fl.get("cell_type", str, "") or None,
        batch=fl.get("batch", str, "") or None,
        covariates=fl.names("covariates"),
        combination_separator=fl.get("combination_separator", str, "") or None,
        numeric_covariates=fl.names("numeric_covariates"),
        numeric_transform=fl.get("numeric_transform", str, "log1p", NUMERIC_TRANSFORMS),
        matrix=matrix,
        values=fl.get("values", str, "any", VALUE_KINDS),
        obsm=fl.names("obsm"),
        perturbation_features=Path(fpath) if features is not None else None,
    )
    if not fields.control:
        raise ManifestError(
            path,
            "fields.control",
            "needs at least one control label (the perturbation label of "
            'control cells, e.g. control = ["non-targeting"])',
        )
    _check_covariates(path, fields)
    pairing = Pairing(
        strategy=pr.get("strategy", str, "batch", STRATEGIES),
        max_pairs_per_condition=pr.get("max_pairs_per_condition", int, 500),
        sentence_size=pr.get("sentence_size", int, 128),
    )
    if pairing.max_pairs_per_condition < 0:
        raise ManifestError(path, "pairing.max_pairs_per_condition", "must be >= 0")
    if not 1 <= pairing.sentence_size <= MAX_SENTENCE:
        raise ManifestError(
            path,
            "pairing.sentence_size",
            f"{pairing.sentence_size} is outside 1..{MAX_SENTENCE} "
            "(cells per sentence; STATE uses 128-512): every sentence stores this many slots",
        )
    split = parse_split(path, sections.get("split") or {})
    check_fields(path, fields, split)
    _check_held_out(path, split)
    return PerturbationConfig(fields, pairing, split)


def check_fields(path: Path, fields: Fields, split: Split) -> None:
    """Settings that contradict each other, named with the fix."""
    both = sorted(set(fields.covariates) & set(fields.numeric_covariates))
    if both:
        raise ManifestError(
            path,
            "fields.numeric_covariates",
            f"{both} also listed in fields.covariates: a column "
            "is either one-hot (covariates) or a number (numeric_covariates)",
        )
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


def _check_covariates(path: Path, fields: Fields) -> None:
    """A covariate is an extra obs field: one named like a standard field (or twice) would be two
    condition columns with one name."""
    taken = {"perturbation", "cell_type", "batch"}  # "batch" even when unset: Fields.column maps it
    for key, name in [
        *(("covariates", c) for c in fields.covariates),
        *(("numeric_covariates", c) for c in fields.numeric_covariates),
    ]:
        if name in taken:
            raise ManifestError(
                path,
                f"fields.{key}",
                f"{name!r} is already a field ({', '.join(sorted(taken))} "
                "and the covariates before it): list each extra obs column once, none of those",
            )
        taken.add(name)


def _check_held_out(path: Path, split: Split) -> None:
    """Explicit zero-shot lists: a cell type is held out for one split only (else test silently
    wins)."""
    both = sorted(set(split.val_cell_types or ()) & set(split.test_cell_types or ()))
    if both:
        raise ManifestError(
            path,
            "split.test_cell_types",
            f"{both} also in split.val_cell_types: hold each cell "
            "type out for val or for test, not both",
        )
