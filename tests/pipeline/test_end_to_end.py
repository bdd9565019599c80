"""A real pipeline build read back by the loader: what a trainer sees equals the source files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from pipeline.build import build
from pipeline.modalities.perturbation.demo import write_perturb_h5ad

GENES = 60


@pytest.fixture(scope="module", params=["zarr", "tar"])
def dataset(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    source_matrix: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> tuple[Path, np.ndarray]:
    root = tmp_path_factory.mktemp(f"e2e-{request.param}")
    (root / "src").mkdir()
    paths = [
        write_perturb_h5ad(
            root / "src" / f"s{i}.h5ad", n_cells=400, n_genes=GENES, n_perts=5, seed=10 + i
        )
        for i in range(2)
    ]
    manifest = write_manifest(root / "m.toml", sentence_size=4)
    manifest.write_text(
        manifest.read_text().replace('format = "zarr"', f'format = "{request.param}"')
    )
    build(manifest, root / "out", jobs=1, progress=False)
    full, _ = source_matrix(paths)
    return root / "out", full.toarray()


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_cells_are_the_source_rows(dataset: tuple[Path, np.ndarray], split: str) -> None:
    out, dense = dataset
    ds = ShardDataset(out, split=split, sample="cells", batch_size=64, shuffle=True, seed=3)
    dl = ShardLoader(ds, num_workers=0)
    ids = []
    for batch in dl:
        sid = batch["sample_id"].numpy()
        np.testing.assert_array_equal(batch["X"].numpy(), dense[sid])
        assert batch["cond"].shape[0] == sid.size
        ids.append(sid)
    ids = np.concatenate(ids)
    assert np.unique(ids).size == ids.size == ds.n_units > 0


@pytest.mark.process
def test_pairs_and_sentences_carry_matching_rows(dataset: tuple[Path, np.ndarray]) -> None:
    out, dense = dataset
    pairs = ShardLoader(
        ShardDataset(out, split="train", sample="pairs", batch_size=32, seed=0), num_workers=0
    )
    n = 0
    for batch in pairs:
        np.testing.assert_array_equal(batch["x_ctrl"].numpy(), dense[batch["ctrl_id"].numpy()])
        np.testing.assert_array_equal(batch["x_pert"].numpy(), dense[batch["pert_id"].numpy()])
        n += batch["x_pert"].shape[0]
    assert n > 0
    sentences = ShardLoader(
        ShardDataset(out, split="train", sample="sentences", batch_size=8, seed=0), num_workers=2
    )
    for batch in sentences:
        assert batch["x_pert"].shape[1:] == (4, GENES)
        np.testing.assert_array_equal(batch["x_pert"].numpy(), dense[batch["pert_id"].numpy()])
        np.testing.assert_array_equal(batch["x_ctrl"].numpy(), dense[batch["ctrl_id"].numpy()])


@pytest.mark.process
@pytest.mark.parametrize("manifest", ["demo.toml", "demo_state.toml"])
def test_shipped_demo_manifests_build_and_verify(tmp_path: Path, manifest: str) -> None:
    import shutil

    from pipeline.commands.demo import write_demo
    from pipeline.verify import verify

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "data_manifests").mkdir()
    shutil.copy(repo / "data_manifests" / manifest, tmp_path / "data_manifests" / manifest)
    write_demo(tmp_path / "data" / "demo")
    res = build(tmp_path / "data_manifests" / manifest, tmp_path / "out", jobs=2, progress=False)
    assert res.index["shards"] and verify(tmp_path / "out") == []
    ds = ShardDataset(tmp_path / "out", split="train", sample="pairs", batch_size=64)
    assert sum(b["x_pert"].shape[0] for b in ShardLoader(ds)) == ds.n_units > 0
