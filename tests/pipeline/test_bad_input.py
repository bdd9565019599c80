"""Bad input: a clear error naming the file and the problem, a non-zero exit, and the previous
dataset intact."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from pipeline.cli import main
from pipeline.errors import ManifestError
from pipeline.manifest import load_manifest
from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from pipeline.verify import verify


@pytest.fixture()
def dataset(tmp_path: Path, build_dataset: Callable[..., Any]) -> tuple[Path, Path, list[Path]]:
    ds = build_dataset(
        tmp_path, "manifest", sources=2, cells=200, genes=50, perts=4, source_name="s{i}.h5ad"
    )
    manifest, paths = ds.manifest, ds.sources
    assert (
        main(
            ["build", str(manifest), "--out", str(tmp_path / "out"), "--jobs", "1", "--no-progress"]
        )
        == 0
    )
    return tmp_path, manifest, paths


def _edit_x(path: Path, fn: Callable[[h5py.Group], None]) -> None:
    with h5py.File(path, "r+") as f:
        fn(f["X"])


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _set(name: str, index: int, value: float) -> Callable[[h5py.Group], None]:
    def edit(x: h5py.Group) -> None:
        arr = x[name][...]
        arr[index] = value
        x[name][...] = arr

    return edit


def _drop_controls(p: Path) -> None:
    import anndata as ad

    a = ad.read_h5ad(p)
    a.obs["perturbation"] = (
        a.obs["perturbation"].astype(str).replace({"control": "KO_X"}).astype("category")
    )
    a.write_h5ad(p)


def _drop_column(p: Path) -> None:
    import anndata as ad

    a = ad.read_h5ad(p)
    del a.obs["batch"]
    a.write_h5ad(p)


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncate, ""),
    "not hdf5": (lambda p: p.write_bytes(b"this is not an HDF5 file" * 100), ""),
    "indptr not monotonic": (lambda p: _edit_x(p, _set("indptr", 5, 10**6 - 1)), "indptr"),
    "index out of range": (lambda p: _edit_x(p, _set("indices", 3, 10**6)), "ind"),
    "nan": (lambda p: _edit_x(p, _set("data", 7, np.nan)), "nan"),
    "negative counts": (lambda p: _edit_x(p, _set("data", 7, -3.0)), "negative"),
    "no control cells": (_drop_controls, "control"),
    "missing obs column": (_drop_column, "batch"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_source_fails_cleanly(
    case: str,
    dataset: tuple[Path, Path, list[Path]],
    capsys: pytest.CaptureFixture[str],
    shard_files: Callable[..., Any],
) -> None:
    root, manifest, paths = dataset
    before_index = (root / "out/index.json").read_bytes()
    before = shard_files(root / "out")
    capsys.readouterr()
    mutate, word = CASES[case]
    mutate(paths[1])
    rc = main(["build", str(manifest), "--out", str(root / "out"), "--jobs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc != 0
    assert str(paths[1]) in err, err
    assert word.lower() in err.lower(), err
    assert (root / "out/index.json").read_bytes() == before_index
    assert shard_files(root / "out") == before
    assert verify(root / "out") == []
    assert not list((root / "out").glob(".spill-*")) and not list(
        (root / "out/shards").glob(".tmp-*")
    )


def test_missing_file_names_the_pattern(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], write_manifest: Callable[..., Any]
) -> None:
    manifest = write_manifest(tmp_path / "m.toml", pattern="nowhere/*.h5ad")
    assert main(["build", str(manifest), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "sources[0].path" in err and "m.toml" in err


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda s: s.replace('mode = "random"', 'mode = "sideways"'), "split.mode"),
        (lambda s: s.replace("seed = 0", 'seed = "zero"'), "dataset.seed"),
        (
            lambda s: s.replace('strategy = "batch"', 'strategy = "batch"\nmystery = 1'),
            "pairing.mystery",
        ),
        (lambda s: s.replace('name = "t"', ""), "dataset.name"),
        (lambda s: s + "\n[broken", "-"),
        (
            lambda s: s + "\n[mystery]\nx = 1\n",
            "manifest.mystery",
        ),  # not a table of [dataset], sources or the kind
        (lambda s: s.replace("seed = 0", "seed = 0\ncolour = 1"), "dataset.colour"),
        (
            lambda s: s.replace('type = "h5ad"', 'type = "npy"'),
            "sources[0].type",
        ),  # feeds kind ct, not perturbation
        (
            lambda s: s.replace('type = "h5ad"', 'type = "parquet"'),
            "sources[0].type",
        ),  # no such source type
        (
            lambda s: s.replace('type = "h5ad"', 'type = "h5ad"\nmatrixx = "X"'),
            "sources[0].matrixx",
        ),
        (lambda s: s.replace('kind = "perturbation"', 'kind = "perturbations"'), "dataset.kind"),
        (
            lambda s: s.replace("[dataset]", '[dataset]\nplugins = ["tests.no_such_module"]'),
            "dataset.plugins",
        ),
        (lambda s: s.replace("shard_size_mb = 0.05", "shard_size_mb = 0"), "dataset.shard_size_mb"),
    ],
)
def test_manifest_errors_name_file_and_key(
    tmp_path: Path, edit: Callable[[str], str], key: str, write_manifest: Callable[..., Any]
) -> None:
    (tmp_path / "src").mkdir()
    write_perturb_h5ad(tmp_path / "src/a.h5ad", n_cells=50, n_genes=20, n_perts=2, seed=0)
    path = write_manifest(tmp_path / "m.toml")
    path.write_text(edit(path.read_text()))
    with pytest.raises(ManifestError) as e:
        load_manifest(path)
    assert "m.toml" in str(e.value) and e.value.key == key
    # a whole-file problem (key "-") names no key: no "[-]" in the message
    assert (f"[{key}]" in str(e.value)) == (key != "-")


def test_source_type_is_inferred_from_the_suffix_or_the_candidates_are_listed(
    tmp_path: Path, write_manifest: Callable[..., Any]
) -> None:
    (tmp_path / "src").mkdir()
    write_perturb_h5ad(tmp_path / "src/a.h5ad", n_cells=50, n_genes=20, n_perts=2, seed=0)
    path = write_manifest(tmp_path / "m.toml")
    path.write_text(path.read_text().replace('type = "h5ad"\n', ""))
    assert [s.type for s in load_manifest(path).sources] == [
        "h5ad"
    ]  # the one perturbation source claiming .h5ad
    (tmp_path / "src/a.h5ad").rename(tmp_path / "src/a.hdf")
    path.write_text(path.read_text().replace("src/*.h5ad", "src/*.hdf"))
    with pytest.raises(ManifestError) as e:
        load_manifest(path)
    msg = str(
        e.value
    )  # names the key, the pattern and every candidate type of the kind with its suffixes
    assert (
        "[sources[0].type]" in msg
        and "src/*.hdf" in msg
        and "'h5ad': ['.h5ad']" in msg
        and "'h5csr'" in msg
    )
    assert "npy" not in msg  # a source of another kind is no candidate
