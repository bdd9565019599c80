"""End-to-end pipeline behaviour: what one build holds (traceability, obs and obsm, pairing,
sentences, splits, condition vectors), verify and the CLI on it, and what the pipeline imports.
Determinism, incremental rebuilds and source flavours: tests/pipeline/test_builds_compared.py."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.verify import summary, verify

N_GENES = 120  # build_dataset's genes per source (its default)


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory,
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> tuple[Path, list[Path], Path]:
    root = tmp_path_factory.mktemp("ds")
    paths = build_dataset(root, "sources").sources
    manifest = write_manifest(root / "m.toml")
    build(manifest, root / "out", jobs=1, progress=False)
    return root / "out", paths, manifest


def test_every_source_row_equals_its_shard_row(
    built: tuple[Path, list[Path], Path],
    read_all: Callable[..., Any],
    shard_csr: Callable[..., Any],
    source_matrix: Callable[..., Any],
) -> None:
    out, paths, _ = built
    index, shards = read_all(out)
    full, _ = source_matrix(paths)
    seen = []
    for _, cols in shards:
        mat = shard_csr(cols, N_GENES)
        ids = cols[fmt.SAMPLE_ID]
        np.testing.assert_array_equal(mat.toarray(), full[ids].toarray())
        seen.append(ids[cols[fmt.PRIMARY]])
    ids = np.concatenate(seen)
    assert np.array_equal(np.sort(ids), np.arange(full.shape[0])), (
        "each cell is primary exactly once"
    )
    assert len(index.shards) > 3 * 3, "small shard size: several shards per (source, split)"
    assert verify(out) == []


def test_obs_codes_and_obsm_round_trip(
    built: tuple[Path, list[Path], Path], read_all: Callable[..., Any]
) -> None:
    import anndata as ad

    out, paths, _ = built
    index, shards = read_all(out)
    adatas = [ad.read_h5ad(p) for p in paths]
    obs = np.concatenate([a.obs["perturbation"].astype(str).to_numpy() for a in adatas])
    pca = np.concatenate([a.obsm["X_pca"] for a in adatas])
    vocab = np.asarray(index.vocabularies["perturbation"])
    for _, cols in shards:
        ids = cols[fmt.SAMPLE_ID]
        assert (vocab[cols["obs/perturbation"]] == obs[ids]).all()
        np.testing.assert_allclose(cols["obsm/X_pca"], pca[ids])


def _decode(index: fmt.Index, cols: dict[str, np.ndarray], field: str) -> np.ndarray:
    return np.asarray(index.vocabularies[field])[cols[fmt.OBS_PREFIX + field]]


def test_pairs_are_batch_matched_or_counted(
    built: tuple[Path, list[Path], Path], read_all: Callable[..., Any]
) -> None:
    out, _, _ = built
    index, shards = read_all(out)
    mismatched = 0
    for _, cols in shards:
        p = cols[fmt.PAIRS]
        pert = _decode(index, cols, "perturbation")
        assert (
            np.isin(pert[p[:, 0]], ["control"]).all()
            and not np.isin(pert[p[:, 1]], ["control"]).any()
        )
        ct, b = cols["obs/cell_type"], cols["obs/batch"]
        mismatched += int(((ct[p[:, 0]] != ct[p[:, 1]]) | (b[p[:, 0]] != b[p[:, 1]])).sum())
    stats = index.raw["stats"]["pairing"]
    assert mismatched <= stats["pairs_cell_type"] + stats["pairs_split"] + stats["pairs_source"]
    assert stats["pairs_exact"] > 0


def test_sentences_are_homogeneous(
    built: tuple[Path, list[Path], Path], read_all: Callable[..., Any]
) -> None:
    out, _, _ = built
    index, shards = read_all(out)
    total = 0
    for _, cols in shards:
        sp_, sc = cols[fmt.SENTENCES_PERT], cols[fmt.SENTENCES_CTRL]
        assert sp_.shape == sc.shape and sp_.shape[1] == 8
        for f in ("perturbation", "cell_type", "batch"):
            c = cols[fmt.OBS_PREFIX + f][sp_]
            assert (c == c[:, :1]).all(), f"sentence mixes {f}"
        assert (_decode(index, cols, "perturbation")[sc] == "control").all()
        total += sp_.shape[0]
    assert total > 0


def test_every_perturbed_cell_is_in_a_sentence(
    built: tuple[Path, list[Path], Path], read_all: Callable[..., Any]
) -> None:
    out, _, _ = built
    index, shards = read_all(out)
    for _, cols in shards:
        pert = _decode(index, cols, "perturbation") != "control"
        in_sentence = np.zeros(pert.size, bool)
        in_sentence[cols[fmt.SENTENCES_PERT].ravel()] = True
        assert (in_sentence[pert & cols[fmt.PRIMARY]]).all()


def test_zeroshot_cell_types_never_reach_train(
    tmp_path: Path,
    build_dataset: Callable[..., Any],
    read_all: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    build_dataset(tmp_path, "sources", sources=2, cells=400)
    manifest = write_manifest(
        tmp_path / "m.toml", split="zeroshot"
    )  # two cell types: one for train, one for test
    manifest.write_text(manifest.read_text().replace("val_fraction = 0.1", "val_fraction = 0.0"))
    build(manifest, tmp_path / "out", jobs=1, progress=False)
    index, shards = read_all(tmp_path / "out")
    by_split: dict[str, set[str]] = {}
    for e, cols in shards:
        by_split.setdefault(e.split, set()).update(_decode(index, cols, "cell_type").tolist())
    held = by_split.get("val", set()) | by_split.get("test", set())
    assert held and not (held & by_split["train"])


def test_fewshot_holds_out_perturbations_per_cell_type(
    tmp_path: Path,
    build_dataset: Callable[..., Any],
    read_all: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    build_dataset(tmp_path, "sources", sources=2, cells=400)
    build(
        write_manifest(tmp_path / "m.toml", split="fewshot"),
        tmp_path / "out",
        jobs=1,
        progress=False,
    )
    index, shards = read_all(tmp_path / "out")
    combos: dict[str, set[tuple[str, str]]] = {}
    for e, cols in shards:
        pert, ct = _decode(index, cols, "perturbation"), _decode(index, cols, "cell_type")
        m = (pert != "control") & cols[fmt.PRIMARY]
        combos.setdefault(e.split, set()).update(zip(ct[m].tolist(), pert[m].tolist(), strict=True))
    assert not (combos["train"] & (combos.get("val", set()) | combos.get("test", set())))
    assert verify(tmp_path / "out") == []


def test_group_without_batch_control_falls_back_and_is_counted(
    tmp_path: Path, build_dataset: Callable[..., Any], write_manifest: Callable[..., Any]
) -> None:
    import anndata as ad

    paths = build_dataset(tmp_path, "sources", sources=1, cells=400).sources
    a = ad.read_h5ad(paths[0])
    b0 = a.obs["batch"].astype(str).to_numpy() == a.obs["batch"].astype(str).iloc[0]
    drop = b0 & (a.obs["perturbation"].astype(str).to_numpy() == "control")
    a[~drop].copy().write_h5ad(paths[0])
    res = build(write_manifest(tmp_path / "m.toml"), tmp_path / "out", jobs=1, progress=False)
    stats = res.index["stats"]["pairing"]
    assert stats["pairs_cell_type"] + stats["pairs_split"] + stats["pairs_source"] > 0
    assert summary(tmp_path / "out")["details"]["pairing"] == stats


@pytest.mark.process
def test_cli_build_inspect_verify(
    built: tuple[Path, list[Path], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    out, _, _ = built
    assert main(["inspect", str(out), "--json"]) == 0
    assert '"compression_ratio"' in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0


def test_verify_detects_a_corrupt_shard(
    built: tuple[Path, list[Path], Path], tmp_path: Path
) -> None:
    out, _, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    index = fmt.read_index(copy)
    chunk = next(
        p for p in sorted(index.shard_path(index.shards[0]).rglob("c/*")) if p.stat().st_size > 16
    )
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    problems = verify(copy)
    assert problems and index.shards[0].file in problems[0]


def test_perturbation_features_fill_the_condition_vectors(
    tmp_path: Path,
    build_dataset: Callable[..., Any],
    read_all: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    import zarr

    paths = build_dataset(tmp_path, "sources", sources=1, cells=300).sources
    import anndata as ad

    names = sorted(set(ad.read_h5ad(paths[0]).obs["perturbation"].astype(str)) - {"control"})
    feats = {n: np.full(3, i + 1, np.float32) for i, n in enumerate(names)}
    np.savez(tmp_path / "feats.npz", **feats)
    manifest = write_manifest(tmp_path / "m.toml")
    manifest.write_text(
        manifest.read_text().replace(
            'values = "counts"', 'values = "counts"\nperturbation_features = "feats.npz"'
        )
    )
    build(manifest, tmp_path / "out", jobs=1, progress=False)
    index, shards = read_all(tmp_path / "out")
    seg = index.conditions.segments[0]
    assert seg["field"] == "perturbation" and seg["encoding"] == "features" and seg["size"] == 3
    vectors = zarr.open_group(str(tmp_path / "out" / index.conditions.file), mode="r")["vectors"][
        ...
    ]
    for _, cols in shards:
        label = _decode(index, cols, "perturbation")
        got = vectors[cols[fmt.COND_ID], :3]
        for name in names[:3]:
            assert (got[label == name] == feats[name]).all()
        assert (got[label == "control"] == 0).all()


@pytest.mark.process
def test_the_pipeline_never_imports_torch() -> None:
    """Every joblib worker imports the pipeline; torch would cost ~300 MiB and ~1 s in each."""
    import subprocess
    import sys

    code = (
        "import sys, pipeline.build, pipeline.cli, pipeline.verify; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.process
def test_a_no_change_rebuild_imports_no_heavy_module(built: tuple[Path, list[Path], Path]) -> None:
    """A nightly no-change rebuild stops after a few stat calls: the registries it asks (kinds,
    sources) must not drag in the readers' libraries nor another kind's (CT's scipy.ndimage)."""
    import subprocess
    import sys

    out, _, manifest = built
    heavy = [
        "anndata",
        "h5py",
        "pandas",
        "scipy",
        "joblib",
        "zarr",
        "pipeline.modalities.ct.kind",
        "pipeline.modalities.ct.npy",
    ]
    code = (
        f"import sys; from pipeline.build import build; r = build({str(manifest)!r}, {str(out)!r}, progress=False);"
        f" print(r.written, sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[] []", res.stdout + res.stderr
