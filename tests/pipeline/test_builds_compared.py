"""Builds compared with builds and with their sources: jobs, backends and the spill path give
byte-identical shards; changing one source rewrites only its shards (the previous generation's kept
for its readers, then retired); every AnnData flavour (legacy, dense, a layer) and cell-load's h5
build the same cells. What one build holds (traceability, pairing, sentences, splits):
tests/modalities/perturbation/test_build_contents.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from pipeline.verify import verify

N_GENES = 120  # build_dataset's genes per source (its default)


@pytest.mark.process
def test_jobs_do_not_change_bytes(
    tmp_path: Path, build_dataset: Callable[..., Any], write_manifest: Callable[..., Any]
) -> None:
    build_dataset(tmp_path, "sources", sources=2, cells=300)
    manifest = write_manifest(tmp_path / "m.toml")
    a = build(manifest, tmp_path / "a", jobs=1, progress=False)
    b = build(manifest, tmp_path / "b", jobs=2, progress=False)
    c = build(manifest, tmp_path / "c", jobs=2, backend="loky", progress=False)
    ea = [(s["file"], s["digest"]) for s in a.index["shards"]]
    assert ea == [(s["file"], s["digest"]) for s in b.index["shards"]]
    assert ea == [(s["file"], s["digest"]) for s in c.index["shards"]]
    assert (tmp_path / "a/index.json").read_bytes() == (tmp_path / "b/index.json").read_bytes()
    assert (tmp_path / "a/index.json").read_bytes() == (tmp_path / "c/index.json").read_bytes()
    for e in a.index["shards"]:  # the bytes themselves, not only the recorded hashes
        assert fmt.content_hash(tmp_path / "a/shards" / e["file"]) == fmt.content_hash(
            tmp_path / "b/shards" / e["file"]
        )


def test_changing_one_source_rewrites_only_its_shards(
    tmp_path: Path,
    build_dataset: Callable[..., Any],
    shard_files: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    paths = build_dataset(tmp_path, "sources", sources=3, cells=300).sources
    manifest = write_manifest(tmp_path / "m.toml")
    first = build(manifest, tmp_path / "out", jobs=1, progress=False)
    before = shard_files(tmp_path / "out")
    # a touch (same bytes, new mtime) changes nothing: not even a new generation
    paths[1].touch()
    again = build(manifest, tmp_path / "out", jobs=1, progress=False)
    assert again.written == [] and shard_files(tmp_path / "out") == before
    assert not again.changed and again.index["generation"] == 1
    # new values in source 1 (same cells and labels): only source 1's shards are rewritten
    write_perturb_h5ad(paths[1], n_cells=300, n_genes=N_GENES, n_perts=6, seed=1, density=0.2)
    third = build(manifest, tmp_path / "out", jobs=1, progress=False)
    src_of = {s["file"]: s["source"] for s in third.index["shards"]}
    assert third.written and {src_of[f] for f in third.written} == {1}
    kept = {k: v for k, v in before.items() if "-001-" not in k}
    after = shard_files(tmp_path / "out")
    assert all(after[k] == v for k, v in kept.items())
    old_1 = [f for f in before if "-001-" in f]
    assert all(f in after for f in old_1), (
        "the previous generation's shards stay for readers that opened it"
    )
    # exactly the shards of the unchanged sources (0 and 2) are reused: the first build's, by name
    unchanged = sorted(s["file"] for s in first.index["shards"] if s["source"] != 1)
    assert sorted(third.reused) == unchanged
    assert len(third.reused) + len(third.written) == len(third.index["shards"])
    assert verify(tmp_path / "out") == []
    # the next commit retires them (generation 1's source-1 shards: named by neither generation 3
    # nor 2)
    write_perturb_h5ad(paths[1], n_cells=300, n_genes=N_GENES, n_perts=6, seed=1, density=0.3)
    fourth = build(manifest, tmp_path / "out", jobs=1, progress=False)
    final = shard_files(tmp_path / "out")
    assert not any(f in final for f in old_1), "stale shards of source 1 are removed"
    assert fourth.index["generation"] == 3 and all(k in final for k in kept)
    assert {f"shards/{f}" for f in third.written} <= {
        f"shards/{s}" for s in fourth.index["previous"]["shards"]
    }


@pytest.mark.parametrize("flavour", ["legacy", "dense", "layers"])
def test_anndata_flavours_build_the_same_cells(
    tmp_path: Path,
    flavour: str,
    read_all: Callable[..., Any],
    shard_csr: Callable[..., Any],
    source_matrix: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    import anndata as ad

    (tmp_path / "src").mkdir()
    p = tmp_path / "src" / "a.h5ad"
    write_perturb_h5ad(
        p,
        n_cells=300,
        n_genes=40,
        n_perts=4,
        seed=3,
        legacy=flavour == "legacy",
        dense=flavour == "dense",
    )
    matrix = "X"
    if flavour == "layers":
        a = ad.read_h5ad(p)
        a.layers["counts"] = a.X.copy()
        a.X = a.X * 0  # the manifest must read the layer, not X
        a.write_h5ad(p)
        matrix = "layers/counts"
    expected = write_perturb_h5ad(tmp_path / "ref.h5ad", n_cells=300, n_genes=40, n_perts=4, seed=3)
    manifest = write_manifest(tmp_path / "m.toml", obsm="[]")
    manifest.write_text(
        manifest.read_text()
        .replace('matrix = "X"', "")
        .replace('values = "counts"', f'values = "counts"\nmatrix = "{matrix}"')
    )
    build(manifest, tmp_path / "out", jobs=1, progress=False)
    full, _ = source_matrix([expected])
    _, shards = read_all(tmp_path / "out")
    for _, cols in shards:
        np.testing.assert_array_equal(
            shard_csr(cols, 40).toarray(), full[cols[fmt.SAMPLE_ID]].toarray()
        )
    assert verify(tmp_path / "out") == []


def test_cell_load_h5_uses_file_stem_as_cell_type(
    tmp_path: Path,
    read_all: Callable[..., Any],
    shard_csr: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    import h5py

    from pipeline.modalities.perturbation.demo import write_h5csr

    (tmp_path / "src").mkdir()
    for stem in ("hepg2", "jurkat"):
        write_h5csr(tmp_path / "src" / f"{stem}.h5", n_cells=300, n_genes=40, seed=len(stem))
    manifest = write_manifest(
        tmp_path / "m.toml",
        pattern="src/*.h5",
        type="h5csr",
        pert="gene",
        batch="gem_group",
        covariates="[]",
        obsm='["X_hvg"]',
    )
    manifest.write_text(
        manifest.read_text().replace('cell_type = "cell_type"', 'cell_type = "cell_line"')
    )
    build(manifest, tmp_path / "out", jobs=2, progress=False)
    index, shards = read_all(tmp_path / "out")
    assert index.vocabularies["cell_type"] == ["hepg2", "jurkat"]
    with h5py.File(tmp_path / "src" / "hepg2.h5") as f:
        g = f["X"]
        first_row = np.zeros(40, np.float32)
        lo, hi = g["indptr"][0], g["indptr"][1]
        first_row[g["indices"][lo:hi]] = g["data"][lo:hi]
    for _, cols in shards:
        hit = np.flatnonzero(cols[fmt.SAMPLE_ID] == 0)
        if hit.size:
            np.testing.assert_array_equal(shard_csr(cols, 40)[hit[0]].toarray().ravel(), first_row)
    assert verify(tmp_path / "out") == []


def test_spill_path_gives_the_same_shards(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    """Big sources go through spill files (or the memory park) instead of one in-memory task; the
    bytes must not change."""
    import pipeline.modalities.perturbation.pack
    import pipeline.parking

    build_dataset(tmp_path, "sources", sources=2, cells=300)
    manifest = write_manifest(tmp_path / "m.toml")
    fused = build(manifest, tmp_path / "fused", jobs=2, progress=False)
    monkeypatch.setattr(pipeline.modalities.perturbation.pack, "FUSE_BYTES", 0)
    monkeypatch.setattr(pipeline.modalities.perturbation.pack, "SCATTER_BYTES", 1)
    monkeypatch.setattr(pipeline.parking, "PARK_BYTES", 1 << 30)  # opt-in: $SHARDSMITH_PARK_MB
    parked = build(manifest, tmp_path / "parked", jobs=2, progress=False)
    monkeypatch.setattr(pipeline.parking, "PARK_BYTES", 0)
    spilled = build(manifest, tmp_path / "spilled", jobs=2, progress=False)
    for other in (parked, spilled):
        assert [(s["file"], s["digest"]) for s in fused.index["shards"]] == [
            (s["file"], s["digest"]) for s in other.index["shards"]
        ]
    assert not list((tmp_path / "spilled").glob(".spill-*"))
