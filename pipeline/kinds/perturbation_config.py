"""The perturbation kind's manifest sections: ``[fields]``, ``[pairing]``, ``[split]`` (typed, validated)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ManifestError
from pipeline.manifest import Table

STRATEGIES = ("batch", "random")
SPLIT_MODES = ("random", "zeroshot", "fewshot")
VALUE_KINDS = ("counts", "any")


@dataclass(frozen=True)
class Fields:
    perturbation: str = "perturbation"
    control: tuple[str, ...] = ("control",)
    cell_type: str = "cell_type"
    batch: str | None = "batch"
    covariates: tuple[str, ...] = ()
    matrix: str = "X"
    values: str = "any"  # "counts": negative values are an error
    obsm: tuple[str, ...] = ()
    perturbation_features: Path | None = None

    @property
    def obs_fields(self) -> tuple[str, ...]:
        """Logical obs fields in condition-vector order (perturbation, cell_type, batch, covariates...)."""
        names = ("perturbation", "cell_type") + (("batch",) if self.batch else ())
        return names + self.covariates

    def column(self, logical: str) -> str:
        """The source obs column holding a logical field (covariates are their own column name)."""
        return {"perturbation": self.perturbation, "cell_type": self.cell_type, "batch": self.batch or ""}.get(
            logical, logical
        )


@dataclass(frozen=True)
class Pairing:
    strategy: str = "batch"
    max_pairs_per_condition: int = 500
    sentence_size: int = 128


@dataclass(frozen=True)
class Split:
    mode: str = "random"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    val_cell_types: tuple[str, ...] | None = None  # zeroshot: explicit held-out cell types
    test_cell_types: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PerturbationConfig:
    fields: Fields
    pairing: Pairing
    split: Split


def parse_sections(path: Path, sections: Mapping[str, Any]) -> PerturbationConfig:
    fl = Table(path, "fields", sections.get("fields") or {},
                {"perturbation", "control", "cell_type", "batch", "covariates", "matrix", "values", "obsm",
                 "perturbation_features"})
    pr = Table(path, "pairing", sections.get("pairing") or {}, {"strategy", "max_pairs_per_condition", "sentence_size"})
    sp = Table(path, "split", sections.get("split") or {},
                {"mode", "val_fraction", "test_fraction", "val_cell_types", "test_cell_types"})

    matrix = fl.get("matrix", str, "X")
    features = fl.get("perturbation_features", str, None)
    if features is not None:
        fpath = (path.parent / features).resolve()
        if fpath.suffix not in (".npy", ".npz", ".csv"):
            raise ManifestError(path, "fields.perturbation_features", "must be .npy, .npz or .csv (never pickle)")
        if not fpath.exists():
            raise ManifestError(path, "fields.perturbation_features", f"file not found: {fpath}")
    fields = Fields(
        perturbation=fl.get("perturbation", str, "perturbation"),
        control=fl.strings("control", ("control",)) or (),
        cell_type=fl.get("cell_type", str, "cell_type"),
        batch=fl.get("batch", (str, type(None)), "batch") or None,
        covariates=fl.strings("covariates", ()) or (),
        matrix=matrix,
        values=fl.get("values", str, "any", VALUE_KINDS),
        obsm=fl.strings("obsm", ()) or (),
        perturbation_features=Path(fpath) if features is not None else None,
    )
    if not fields.control:
        raise ManifestError(path, "fields.control", 'needs at least one control label (the perturbation label of '
                            'control cells, e.g. control = ["non-targeting"])')
    _check_covariates(path, fields)
    pairing = Pairing(
        strategy=pr.get("strategy", str, "batch", STRATEGIES),
        max_pairs_per_condition=pr.get("max_pairs_per_condition", int, 500),
        sentence_size=pr.get("sentence_size", int, 128),
    )
    if pairing.max_pairs_per_condition < 0:
        raise ManifestError(path, "pairing.max_pairs_per_condition", "must be >= 0")
    if pairing.sentence_size < 1:
        raise ManifestError(path, "pairing.sentence_size", "must be >= 1")
    split = Split(
        mode=sp.get("mode", str, "random", SPLIT_MODES),
        val_fraction=float(sp.get("val_fraction", (int, float), 0.1)),
        test_fraction=float(sp.get("test_fraction", (int, float), 0.1)),
        val_cell_types=sp.strings("val_cell_types", None),
        test_cell_types=sp.strings("test_cell_types", None),
    )
    for key in ("val_fraction", "test_fraction"):
        if not 0.0 <= getattr(split, key) < 1.0:
            raise ManifestError(path, f"split.{key}", "must be in [0, 1)")
    if split.val_fraction + split.test_fraction >= 1.0:
        raise ManifestError(path, "split", "val_fraction + test_fraction must be < 1")
    _check_held_out(path, split)
    return PerturbationConfig(fields, pairing, split)


def _check_covariates(path: Path, fields: Fields) -> None:
    """A covariate is an extra obs field: one named like a standard field (or twice) would be two condition
    columns with one name."""
    taken = {"perturbation", "cell_type", "batch"}  # "batch" even when unset: Fields.column maps it
    for name in fields.covariates:
        if name in taken:
            raise ManifestError(path, "fields.covariates", f"{name!r} is already a field ({', '.join(sorted(taken))} "
                                "and the covariates before it): list each extra obs column once, none of those")
        taken.add(name)


def _check_held_out(path: Path, split: Split) -> None:
    """Explicit zero-shot lists: a cell type is held out for one split only (else test silently wins)."""
    both = sorted(set(split.val_cell_types or ()) & set(split.test_cell_types or ()))
    if both:
        raise ManifestError(path, "split.test_cell_types", f"{both} also in split.val_cell_types: hold each cell "
                            "type out for val or for test, not both")
