"""Manifest values that used to be accepted silently or end in a traceback: each is now exit 2 with
an error naming the manifest file, the key and the allowed values (cases:
tests/hostile/values.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.errors import SourceError
from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from pipeline.modalities.perturbation.validate import check_float32_exact, validate_block
from pipeline.verify import verify
from tests import hostile


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]) -> Path:
    root = tmp_path_factory.mktemp("validation")
    build_dataset(
        root, "sources", sources=1, cells=120, genes=30, perts=3, source_name="a.h5ad"
    )  # cell types K562, HepG2
    return root


def _build(manifest: Path, out: Path) -> int:
    return main(["build", str(manifest), "--out", str(out), "--jobs", "1", "--no-progress"])


@hostile.parametrize
def test_manifest_value_is_refused(
    case: hostile.Case,
    sources: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    write_manifest: Callable[..., Any],
) -> None:
    (old, new), key, allowed = case.data
    manifest = write_manifest(sources / f"{case.id}.toml")
    text = manifest.read_text()
    assert old in text, f"the case's edit does not apply: {old!r}"
    manifest.write_text(text.replace(old, new))
    capsys.readouterr()
    assert _build(manifest, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"[{key}]" in err and str(manifest) in err and allowed in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "index.json").exists()


@hostile.parametrize
def test_tiny_shard_size_plans_no_empty_shard(
    case: hostile.Case,
    tmp_path: Path,
    read_all: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    (tmp_path / "src").mkdir()
    write_perturb_h5ad(
        tmp_path / "src/a.h5ad", n_cells=24, n_genes=400, n_perts=2, seed=0
    )  # ~1 kB per cell
    manifest = write_manifest(tmp_path / "tiny.toml", shard_mb=0.0001, covariates="[]", obsm="[]")
    assert _build(manifest, tmp_path / "out") == 0
    index, shards = read_all(tmp_path / "out")
    assert all(
        e.units["cells"] == 1 for e, _ in shards
    )  # one cell per shard: the cap, not an empty shard
    assert len(shards) == 24


@pytest.fixture(scope="module")
def built(sources: Path, write_manifest: Callable[..., Any]) -> Path:
    manifest = write_manifest(sources / "ok.toml")
    assert _build(manifest, sources / "built") == 0
    return sources / "built"


def _edit_index(doc: dict, what: str) -> None:
    if what == "vocabularies":
        labels = doc["vocabularies"]["perturbation"]
        labels[-1] = labels[-1] + "X"
    elif what == "sections":
        names = doc["sections"]["perturbation"]["var_names"]
        names[0], names[1] = names[1], names[0]
    elif what == "conditions":
        doc["conditions"]["dim"] += 1
    else:
        del doc["digest"]


@hostile.parametrize
def test_verify_catches_an_edited_index(case: hostile.Case, built: Path, tmp_path: Path) -> None:
    assert verify(built) == []
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    doc = json.loads((copy / "index.json").read_text())
    _edit_index(doc, case.data)
    (copy / "index.json").write_text(json.dumps(doc))
    problems = verify(copy, check_hashes=False)
    want = (
        "no content digest" if case.data == "digest" else f"{case.data!r} differs from the digest"
    )
    assert any(want in p and "index.json" in p for p in problems), problems
    assert main(["verify", str(copy), "--no-hash"]) == 1


def test_the_float32_check_hands_its_extremes_to_the_block_check() -> None:
    """check_float32_exact measures a counts block's min and max; validate_block reuses them
    instead of two more passes, and still reports what they reveal."""
    counts = np.array([3.0, 0.0, 7.0, 1.0], np.float32)
    assert check_float32_exact(counts, "x.h5ad", 0, np.array([0, 2, 4]), True) == (0.0, 7.0)
    # float32 values not declared counts: nothing to measure
    assert check_float32_exact(counts, "x.h5ad", 0, np.array([0, 2, 4]), False) is None
    negative = np.array([3.0, -1.0], np.float32)
    extremes = check_float32_exact(negative, "x.h5ad", 0, np.array([0, 1, 2]), True)
    with pytest.raises(SourceError, match="negative value"):
        validate_block(
            (negative, np.array([0, 1]), np.array([0, 1, 2]), 5), "x.h5ad", 0, True, extremes
        )
