"""Split options in the manifest (few-shot lists and fractions per cell type, controls kept in
train) and the counted warnings a build reports (fallback matches, splits without pairs or
sentences, short groups)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from pipeline.modalities.perturbation.kind import plan_warnings
from pipeline.modalities.perturbation.splits import _by_fraction
from pipeline.seeding import stable_unit
from pipeline.verify import summary, verify


@pytest.fixture
def primary_splits(read_all: Callable[..., Any]) -> Callable[[Path], dict[int, str]]:
    """``primary_splits(out)``: sample_id -> split of every primary cell of a built dataset."""

    def splits(out: Path) -> dict[int, str]:
        _, shards = read_all(out)
        return {
            sid: e.split
            for e, cols in shards
            for sid in cols[fmt.SAMPLE_ID][cols[fmt.PRIMARY]].tolist()
        }

    return splits


def test_fewshot_lists_and_fractions_per_cell_type(
    tmp_path: Path, write_manifest: Callable[..., Any], primary_splits: Callable[..., Any]
) -> None:
    src = write_perturb_h5ad(
        tmp_path / "src" / "a.h5ad", n_cells=600, n_genes=30, n_perts=10, seed=4
    )
    obs = ad.read_h5ad(src).obs
    perts = sorted(set(obs["perturbation"].astype(str)) - {"control"})
    manifest = write_manifest(tmp_path / "m.toml", split="fewshot")
    manifest.write_text(
        manifest.read_text() + f'controls = "train"\n[split.fewshot.K562]\ntest = ["{perts[0]}"]\n'
        f'val = ["{perts[1]}"]\nval_fraction = 0.4\ntest_fraction = 0.3\n'
    )
    build(manifest, tmp_path / "out", jobs=1, progress=False)
    assert verify(tmp_path / "out") == []
    recorded = fmt.read_index(tmp_path / "out").sections["perturbation"]["split"]
    assert recorded["controls"] == "train" and recorded["fewshot"] == {
        "K562": {"val": [perts[1]], "test": [perts[0]], "val_fraction": 0.4, "test_fraction": 0.3}
    }  # what index.json records of the split (kind.split_section)
    got = primary_splits(tmp_path / "out")
    for i, (ct, pert) in enumerate(
        zip(obs["cell_type"].astype(str), obs["perturbation"].astype(str), strict=True)
    ):
        if pert == "control" or ct != "K562":
            want = "train"  # controls stay in train; unlisted cell types are not few-shot
        elif pert in (perts[0], perts[1]):
            want = "test" if pert == perts[0] else "val"
        else:
            u = np.array([stable_unit(0, "fewshot", ct, pert)])
            want = ("train", "val", "test")[int(_by_fraction(u, 0.4, 0.3)[0])]
        assert got[i] == want, (i, ct, pert)


def test_zeroshot_controls_heldout_or_train(
    tmp_path: Path, write_manifest: Callable[..., Any], primary_splits: Callable[..., Any]
) -> None:
    write_perturb_h5ad(tmp_path / "src" / "a.h5ad", n_cells=500, n_genes=30, n_perts=6, seed=5)
    obs = ad.read_h5ad(tmp_path / "src" / "a.h5ad").obs
    held_ctrl = np.flatnonzero(
        (obs["cell_type"] == "HepG2").to_numpy() & (obs["perturbation"] == "control").to_numpy()
    )
    for controls, where in (("heldout", "test"), ("train", "train")):
        manifest = write_manifest(tmp_path / f"{controls}.toml", split="zeroshot")
        manifest.write_text(
            manifest.read_text() + f'test_cell_types = ["HepG2"]\ncontrols = "{controls}"\n'
        )
        out = tmp_path / controls
        build(manifest, out, jobs=1, progress=False)
        got = primary_splits(out)
        assert {got[int(i)] for i in held_ctrl} == {where}
        assert (
            summary(out)["details"]["pairing"]["pairs_source"] == 0
        )  # test cells find their cell type's controls


@pytest.mark.process
def test_warnings_count_fallbacks_empty_splits_and_short_groups(
    tmp_path: Path, write_manifest: Callable[..., Any]
) -> None:
    src = write_perturb_h5ad(
        tmp_path / "src" / "a.h5ad",
        n_cells=400,
        n_genes=30,
        n_perts=6,
        batches=6,
        seed=6,
        control_fraction=0.05,
    )
    perts = sorted(set(ad.read_h5ad(src).obs["perturbation"].astype(str)) - {"control"})
    manifest = write_manifest(tmp_path / "m.toml", split="fewshot", sentence_size=64)
    manifest.write_text(
        manifest.read_text() + f'[split.fewshot.K562]\ntest = ["{perts[0]}"]\n'
    )  # val: controls only
    build(manifest, tmp_path / "out", jobs=1, progress=False)
    s = summary(tmp_path / "out")
    text = "\n".join(s["warnings"])
    pairing = s["details"]["pairing"]
    beyond = sum(v for k, v in pairing.items() if k.startswith("pairs_") and k != "pairs_exact")
    assert (
        beyond > 0
        and f"{beyond} of {beyond + pairing['pairs_exact']} pairs took a control beyond" in text
    )
    assert "sentence slots took a control beyond" in text
    assert "split 'val' has" in text and "but no pairs" in text and "but no sentences" in text
    assert "fewer cells than sentence_size = 64" in text
    cli = subprocess.run(
        [sys.executable, "-m", "pipeline", "inspect", str(tmp_path / "out"), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(cli.stdout)["warnings"] == s["warnings"]
    cli = subprocess.run(
        [sys.executable, "-m", "pipeline", "inspect", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "warning: " in cli.stdout
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            str(manifest),
            "--out",
            str(tmp_path / "o2"),
            "--no-progress",
            "--jobs",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "  warning: " in cli.stderr  # the build's own summary (stdout is the JSON, --json)
    assert (
        json.loads(cli.stdout.strip().splitlines()[-1])["warnings"] == s["warnings"]
    )  # and its JSON line


def test_plan_warnings_are_silent_when_all_is_well() -> None:
    stats = {
        "pairing": {"pairs_exact": 10, "pairs_cell_type": 0, "sentence_slots_exact": 64},
        "checks": {
            "pairs_train": 10,
            "sentences_train": 2,
            "short_perturbation_groups": 0,
            "perturbation_groups": 3,
        },
        "cells_per_split": {"train": 40, "val": 0, "test": 0},
    }
    assert plan_warnings(stats, 32) == []
    stats["checks"]["short_perturbation_groups"] = 2
    assert plan_warnings(stats, 32) == [
        "2 of 3 perturbations (per source, split and cell type) have fewer cells "
        "than sentence_size = 32: their sentences repeat cells"
    ]
