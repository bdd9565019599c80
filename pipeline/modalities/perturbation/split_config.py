"""The perturbation kind's ``[split]`` section: modes, held-out controls, few-shot lists, cell-load
experiments.

Kept apart from the ``[fields]``/``[pairing]`` parser because the split rules carry their own
vocabulary (cell-load's zero-shot and few-shot, GEARS' unseen combinations). A referenced
experiment file is read (:mod:`pipeline.modalities.perturbation.experiment`) when the manifest is
loaded, so a typo fails before any source is opened; what index.json records of the split is the
kind's (:func:`pipeline.modalities.perturbation.kind.split_section`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.errors import ManifestError
from pipeline.schema import key, read

SPLIT_MODES = ("random", "zeroshot", "fewshot")
# where a held-out cell type's (zeroshot) or a few-shot split's controls go
CONTROLS = ("heldout", "train")
COMBINATIONS = ("any", "seen_genes")  # fewshot: which perturbations may leave train
# the keys an experiment file decides: set with cellload_toml, they are refused
CELLLOAD_DECIDES = ("mode", "val_cell_types", "test_cell_types", "fewshot", "combinations")


def fraction(default: float, doc: str = "") -> Any:
    """A fraction key in [0, 1)."""
    return key("number", default, minimum=0, exclusive_maximum=1, convert=float, doc=doc)


@dataclass(frozen=True)
class FewshotEntry:
    """One few-shot cell type: perturbations listed by name, and/or a fraction of the others drawn
    per perturbation (a stable hash of seed, cell type and perturbation). Unlisted perturbations
    stay in train."""

    val: tuple[str, ...] = key("strings", (), doc="perturbations held out for val")
    test: tuple[str, ...] = key("strings", (), doc="perturbations held out for test")
    val_fraction: float = fraction(0.0)
    test_fraction: float = fraction(0.0)


@dataclass(frozen=True)
class Experiment:
    """A cell-load experiment TOML (``[datasets]``, ``[training]``, ``[zeroshot]``, ``[fewshot]``)."""

    path: Path
    sha256: str
    datasets: dict[str, str]
    training: dict[str, str]
    zeroshot: dict[str, str]  # "dataset.celltype" -> split
    fewshot: dict[str, FewshotEntry]  # "dataset.celltype" -> entry

    def used(self) -> set[str]:
        """Dataset names the experiment uses (cell-load's ``get_all_datasets``)."""
        return set(self.training) | {k.split(".", 1)[0] for k in (*self.zeroshot, *self.fewshot)}


@dataclass(frozen=True)
class Split:
    """[split]: which cells go to val and test (random, zero-shot cell types, few-shot lists, or
    a cell-load experiment file)."""

    mode: str = key("string", None, choices=SPLIT_MODES, doc='default "random"')
    val_fraction: float = fraction(0.1)
    test_fraction: float = fraction(0.1)
    val_cell_types: tuple[str, ...] | None = key("strings", None, doc="zeroshot: held out for val")
    test_cell_types: tuple[str, ...] | None = key("strings", None, doc="zeroshot: for test")
    controls: str = key("string", None, choices=CONTROLS, doc='default "heldout"')
    combinations: str = key("string", None, choices=COMBINATIONS, doc='default "any"')
    fewshot: dict[str, FewshotEntry] | None = key("table", None, doc="cell type -> lists")
    cellload_toml: str | None = key("string", None, doc="a cell-load experiment file")
    experiment: Experiment | None = field(default=None)  # read from cellload_toml


def parse_fewshot_entry(path: Path | str, where: str, data: Any) -> FewshotEntry:
    entry = FewshotEntry(**read(path, where, data, FewshotEntry))
    if entry.val_fraction + entry.test_fraction >= 1.0:
        raise ManifestError(path, where, "val_fraction + test_fraction must be < 1")
    return entry


def refuse_decided(path: Path, data: Mapping[str, Any]) -> None:
    """With ``cellload_toml`` set, the keys the experiment file decides are refused."""
    clash = [k for k in sorted(CELLLOAD_DECIDES) if data[k] is not None]
    if clash:
        raise ManifestError(
            path,
            f"split.{clash[0]}",
            "not used with split.cellload_toml (the experiment file "
            "decides every cell's split): remove one of the two",
        )


def parse_split(path: Path, data: Mapping[str, Any], experiment: Experiment | None) -> Split:
    """The checked ``[split]`` table (and the experiment file it names, read already by
    :func:`pipeline.modalities.perturbation.experiment.load_experiment` after
    :func:`refuse_decided`): defaults that depend on it set, and the rules between keys."""
    sp = Split(**data)
    fewshot = None
    if sp.fewshot is not None:
        fewshot = {
            ct: parse_fewshot_entry(path, f"split.fewshot.{ct}", v) for ct, v in sp.fewshot.items()
        }
    split = replace(
        sp,
        mode="cellload" if experiment is not None else sp.mode or "random",
        controls=sp.controls or ("train" if experiment is not None else "heldout"),
        combinations=sp.combinations or "any",
        fewshot=fewshot,
        experiment=experiment,
    )
    if split.val_fraction + split.test_fraction >= 1.0:
        raise ManifestError(path, "split", "val_fraction + test_fraction must be < 1")
    if experiment is not None and split.controls != "train":
        raise ManifestError(
            path, "split.controls", 'cell-load keeps controls in train: use "train" or leave it out'
        )
    if split.controls != "heldout" and split.mode == "random" and experiment is None:
        raise ManifestError(
            path,
            "split.controls",
            'applies to mode = "zeroshot" or "fewshot" (random splits '
            "draw controls per cell like every other cell)",
        )
    if fewshot is not None and split.mode != "fewshot":
        raise ManifestError(
            path,
            "split.fewshot",
            f'per-cell-type lists need mode = "fewshot" (mode is {split.mode!r})',
        )
    if split.combinations != "any" and split.mode != "fewshot":
        raise ManifestError(
            path, "split.combinations", f'applies to mode = "fewshot" (mode is {split.mode!r})'
        )
    return split
