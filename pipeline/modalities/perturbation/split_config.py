"""The perturbation kind's ``[split]`` section: modes, held-out controls, few-shot lists, cell-load
experiments.

Kept apart from the ``[fields]``/``[pairing]`` parser because the split rules carry their own
vocabulary (cell-load's zero-shot and few-shot, GEARS' unseen combinations) and a referenced
experiment file that is read and checked here, when the manifest is loaded, so a typo fails
before any source is opened.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from pipeline.errors import ManifestError
from pipeline.manifest import Table

SPLIT_MODES = ("random", "zeroshot", "fewshot")
CONTROLS = (
    "heldout",
    "train",
)  # where a held-out cell type's (zeroshot) or a few-shot split's controls go
COMBINATIONS = ("any", "seen_genes")  # fewshot: which perturbations may leave train
SPLIT_KEYS = {
    "mode",
    "val_fraction",
    "test_fraction",
    "val_cell_types",
    "test_cell_types",
    "controls",
    "combinations",
    "fewshot",
    "cellload_toml",
}
FEWSHOT_KEYS = {"val", "test", "val_fraction", "test_fraction"}


@dataclass(frozen=True)
class FewshotEntry:
    """One few-shot cell type: perturbations listed by name, and/or a fraction of the others drawn
    per perturbation (a stable hash of seed, cell type and perturbation). Unlisted perturbations
    stay in train."""

    val: tuple[str, ...] = ()
    test: tuple[str, ...] = ()
    val_fraction: float = 0.0
    test_fraction: float = 0.0


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
    mode: str = "random"
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    val_cell_types: tuple[str, ...] | None = None  # zeroshot: explicit held-out cell types
    test_cell_types: tuple[str, ...] | None = None
    controls: str = "heldout"
    combinations: str = "any"
    fewshot: dict[str, FewshotEntry] | None = (
        None  # fewshot: per-cell-type lists/fractions (others: train)
    )
    experiment: Experiment | None = field(
        default=None
    )  # cellload_toml: the experiment decides every split

    def index_section(self) -> dict[str, Any]:
        """What the index records about the split: today's three keys, plus the new options only
        when used (an index built without them stays byte-identical)."""
        out: dict[str, Any] = {
            "mode": self.mode,
            "val_fraction": self.val_fraction,
            "test_fraction": self.test_fraction,
        }
        if self.controls != "heldout":
            out["controls"] = self.controls
        if self.combinations != "any":
            out["combinations"] = self.combinations
        if self.fewshot is not None:
            out["fewshot"] = {
                ct: {
                    "val": list(e.val),
                    "test": list(e.test),
                    "val_fraction": e.val_fraction,
                    "test_fraction": e.test_fraction,
                }
                for ct, e in sorted(self.fewshot.items())
            }
        if self.experiment is not None:
            out["cellload_toml"] = {
                "path": self.experiment.path.name,
                "sha256": self.experiment.sha256,
            }
        return out


def _fraction(path: Path | str, key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= float(v) < 1.0:
        raise ManifestError(path, key, f"must be a number in [0, 1), got {v!r}")
    return float(v)


def parse_fewshot_entry(path: Path | str, key: str, data: Any) -> FewshotEntry:
    t = Table(Path(path), key, data, FEWSHOT_KEYS)
    entry = FewshotEntry(
        val=t.strings("val", ()) or (),
        test=t.strings("test", ()) or (),
        val_fraction=_fraction(path, f"{key}.val_fraction", t.data.get("val_fraction", 0.0)),
        test_fraction=_fraction(path, f"{key}.test_fraction", t.data.get("test_fraction", 0.0)),
    )
    if entry.val_fraction + entry.test_fraction >= 1.0:
        raise ManifestError(path, key, "val_fraction + test_fraction must be < 1")
    return entry


def load_experiment(manifest: Path, rel: str) -> Experiment:
    """Read and check a cell-load experiment file, with errors naming the file and the key to fix."""
    path = (manifest.parent / rel).resolve()
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ManifestError(
            manifest,
            "split.cellload_toml",
            f"cannot read {path} ({e.strerror or e}); the path is relative to the manifest",
        ) from None
    try:
        raw = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(path, "-", f"not valid TOML: {e}") from None
    unknown = sorted(set(raw) - {"datasets", "training", "zeroshot", "fewshot"})
    if unknown:
        raise ManifestError(
            path,
            unknown[0],
            "unknown table (a cell-load experiment has [datasets], [training], "
            "[zeroshot], [fewshot])",
        )
    tables: dict[str, dict[str, Any]] = {}
    for name in ("datasets", "training", "zeroshot", "fewshot"):
        v = raw.get(name, {})
        if not isinstance(v, dict):
            raise ManifestError(path, name, "must be a table")
        tables[name] = v
    for name in ("datasets", "training", "zeroshot"):
        for k, v in tables[name].items():
            if not isinstance(v, str):
                raise ManifestError(path, f"{name}.{k}", f"must be a string, got {v!r}")
    for k, v in tables["zeroshot"].items():
        if "." not in k:
            raise ManifestError(path, f"zeroshot.{k}", 'keys are "dataset.celltype"')
        if v not in ("train", "val", "test"):
            raise ManifestError(
                path, f"zeroshot.{k}", f"{v!r} is not one of ['train', 'val', 'test']"
            )
    fewshot = {}
    for k, v in tables["fewshot"].items():
        if "." not in k:
            raise ManifestError(
                path,
                f"fewshot.{k}",
                'keys are "dataset.celltype" (a [fewshot."dataset.celltype"] table)',
            )
        fewshot[k] = parse_fewshot_entry(path, f"fewshot.{k}", v)
    exp = Experiment(
        path,
        hashlib.sha256(data).hexdigest(),
        dict(tables["datasets"]),
        dict(tables["training"]),
        dict(tables["zeroshot"]),
        fewshot,
    )
    missing = sorted(exp.used() - set(exp.datasets))
    if missing:
        raise ManifestError(
            path,
            "datasets",
            f"no path for dataset(s) {missing}: add e.g. {missing[0]} = "
            '"/path/to/folder/" under [datasets]',
        )
    return exp


def parse_split(path: Path, data: Mapping[str, Any]) -> Split:
    sp = Table(path, "split", data, SPLIT_KEYS)
    experiment = None
    if "cellload_toml" in sp.data:
        clash = sorted(
            set(sp.data) & {"mode", "val_cell_types", "test_cell_types", "fewshot", "combinations"}
        )
        if clash:
            raise ManifestError(
                path,
                f"split.{clash[0]}",
                "not used with split.cellload_toml (the experiment file "
                "decides every cell's split): remove one of the two",
            )
        experiment = load_experiment(path, sp.get("cellload_toml", str))
    fewshot = None
    if "fewshot" in sp.data:
        raw = sp.get("fewshot", dict)
        fewshot = {ct: parse_fewshot_entry(path, f"split.fewshot.{ct}", v) for ct, v in raw.items()}
    split = Split(
        mode="cellload" if experiment is not None else sp.get("mode", str, "random", SPLIT_MODES),
        val_fraction=float(sp.get("val_fraction", (int, float), 0.1)),
        test_fraction=float(sp.get("test_fraction", (int, float), 0.1)),
        val_cell_types=sp.strings("val_cell_types", None),
        test_cell_types=sp.strings("test_cell_types", None),
        controls=sp.get(
            "controls", str, "train" if experiment is not None else "heldout", CONTROLS
        ),
        combinations=sp.get("combinations", str, "any", COMBINATIONS),
        fewshot=fewshot,
        experiment=experiment,
    )
    for key in ("val_fraction", "test_fraction"):
        if not 0.0 <= getattr(split, key) < 1.0:
            raise ManifestError(
                path, f"split.{key}", f"must be in [0, 1), got {getattr(split, key)}"
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
