"""CT end to end: .npy volumes -> build (zarr, tar) -> ShardDataset(sample="ct") equals the
independent reference; skips counted; subsample deterministic; budget batches; crops/flips; a
folder source and verify's check; conformance. Bad input, manifest errors, split groups and the
shipped manifests: tests/modalities/ct/test_ct_pipeline_inputs.py. The manifest and build helpers are the
``ct_npy`` fixture (tests/plugin_fixtures.py)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from loaders import format as fmt
from loaders.testing import SampleTypeTests
from pipeline.manifest import load_manifest
from pipeline.modalities.ct.demo import write_ct_demo
from pipeline.model import get_kind
from pipeline.verify import format_summary, summary, verify

TIMEOUT = 120


def write_sources(root: Path) -> list[Path]:
    """The demo chests, a float32 copy of one, a tiny volume (< min_points) and one of air only
    (empty mask)."""
    vols = write_ct_demo(root)
    d = root / "vols"
    d.mkdir(exist_ok=True)
    for p in vols:
        shutil.copy(p, d / p.name)
        if p.with_suffix(".json").exists():
            shutil.copy(p.with_suffix(".json"), d / p.with_suffix(".json").name)
    np.save(d / "chest_float.npy", np.load(vols[0]).astype(np.float32) + np.float32(0.2))
    tiny = np.full((12, 12, 6), -1000, np.int16)
    tiny[2:10, 2:10, :] = 40
    tiny[5:7, 5:7, 2:4] = -850  # 8 lung voxels
    np.save(d / "tiny.npy", tiny)
    np.save(d / "air.npy", np.full((16, 16, 8), -1000, np.int16))
    return sorted(d.glob("*.npy"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = tmp_path_factory.mktemp("ct-src")
    return root, write_sources(root)


@pytest.fixture(scope="module", params=["zarr", "tar"])
def built(request: pytest.FixtureRequest, sources: tuple[Path, list[Path]], ct_npy: Any) -> Path:
    root, _ = sources
    return ct_npy.make(root, request.param, out=f"out-{request.param}")


def volumes(batches: list[dict[str, Any]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """sample_id -> (xyz int32 [k,3], feats [k,C]) from collated batches (asserting the layout on
    the way)."""
    out = {}
    for b in batches:
        coords, feats, off = b["coords"].numpy(), b["feats"].numpy(), b["offsets"].numpy()
        assert coords.dtype == np.int32 and feats.dtype == np.float32 and off.dtype == np.int64
        assert (
            off[0] == 0
            and off[-1] == coords.shape[0] == feats.shape[0]
            and off.size == b["sample_id"].numel() + 1
        )
        for i, sid in enumerate(b["sample_id"].tolist()):
            rows = slice(off[i], off[i + 1])
            assert np.all(
                coords[rows, 0] == i
            )  # rows of a volume contiguous, batch index in column 0
            out[sid] = (coords[rows, 1:], feats[rows])
    return out


@pytest.mark.process
@pytest.mark.parametrize("workers", [0, 2])
def test_points_equal_the_reference(
    built: Path,
    sources: tuple[Path, list[Path]],
    workers: int,
    reference_points: Callable[..., Any],
) -> None:
    _, paths = sources
    index = fmt.read_index(built)
    assert [Path(s["path"]).name for s in index.sources] == [
        p.name for p in paths
    ]  # sorted glob order
    ds = ShardDataset(built, split="train", sample="ct", batch_size=2, shuffle=False)
    got = volumes(list(ShardLoader(ds, num_workers=workers, timeout=TIMEOUT)))
    skipped = {"tiny.npy", "air.npy"}
    assert sorted(got) == [i for i, p in enumerate(paths) if p.name not in skipped]
    for sid, (xyz, feats) in got.items():
        path = Path(index.sources[sid]["path"])
        assert path.name == paths[sid].name  # sample_id maps back to the source file
        hu = np.rint(np.load(path)).astype(np.int16)
        coords, ref_hu, ref_w = reference_points(hu)
        np.testing.assert_array_equal(xyz, coords)
        np.testing.assert_array_equal(feats[:, 0], ref_hu.astype(np.float32))
        np.testing.assert_array_equal(feats[:, 1], ref_w.astype(np.float32))
    assert index.stats["skipped"] == {"fewer points than min_points": 1, "empty body mask": 1}


def test_index_records_verify_and_inspect(built: Path) -> None:
    index = fmt.read_index(built)
    assert verify(built) == []
    recs = {r["file"]: r for rs in index.section("ct")["records"].values() for r in rs}
    assert set(recs) == {
        "chest_000.npy",
        "chest_001.npy",
        "chest_002.npy",
        "chest_003.npy",
        "chest_float.npy",
    }
    assert (
        recs["chest_000.npy"]["spacing"] == [0.78, 0.78, 2.5]
        and recs["chest_001.npy"]["spacing"] is None
    )
    assert recs["chest_float.npy"]["source_dtype"] == "<f4" and recs["chest_000.npy"]["shape"] == [
        64,
        64,
        24,
    ]
    for (
        entry
    ) in index.shards:  # per-record point counts match the shards (the loader plans with them)
        cols = fmt_read(index, entry)
        np.testing.assert_array_equal(
            np.diff(cols["coords/offsets"]),
            [r["points"] for r in index.section("ct")["records"][entry.file]],
        )
    text = format_summary(summary(built))
    assert "kept: " in text and "% of voxels" in text
    assert 0.03 < summary(built)["details"]["fraction_kept"] < 0.1


def fmt_read(index: fmt.Index, entry: fmt.ShardEntry) -> dict[str, np.ndarray]:
    from loaders.format.readers import read_shard

    return read_shard(
        index.shard_path(entry), index.encoding, fmt.shard_keys(index.fields, index.tables)
    )


@pytest.mark.process
def test_max_points_subsample_is_deterministic_across_jobs_and_encodings(
    sources: tuple[Path, list[Path]], reference_points: Callable[..., Any], ct_npy: Any
) -> None:
    root, paths = sources
    a = ct_npy.make(root, "zarr", max_points=3000, jobs=1, out="cap-a")
    b = ct_npy.make(root, "zarr", max_points=3000, jobs=2, out="cap-b")
    t = ct_npy.make(root, "tar", max_points=3000, jobs=2, out="cap-t")
    ia, ib = fmt.read_index(a), fmt.read_index(b)
    assert [s.digest for s in ia.shards] == [s.digest for s in ib.shards]  # byte-identical shards
    ds = lambda r: ShardDataset(r, sample="ct", batch_size=3, shuffle=False, features=["hu"])  # noqa: E731
    va, vt = volumes(list(ds(a))), volumes(list(ds(t)))
    for sid, (xyz, feats) in va.items():
        np.testing.assert_array_equal(xyz, vt[sid][0])
        full = reference_points(np.rint(np.load(paths[sid])).astype(np.int16))
        assert xyz.shape[0] == min(3000, len(full[0])) and feats.shape[1] == 1
        flat_full = np.ravel_multi_index(full[0].T.astype(np.int64), (128, 128, 128))
        flat = np.ravel_multi_index(xyz.T.astype(np.int64), (128, 128, 128))
        pos = np.searchsorted(flat_full, flat)
        np.testing.assert_array_equal(
            flat_full[pos], flat
        )  # a subset of the full record, in argwhere order
        np.testing.assert_array_equal(feats[:, 0], full[1][pos])
    assert summary(a)["details"]["subsampled"] == 5


@pytest.mark.process
def test_budget_batches_through_the_dataset(built: Path) -> None:
    index = fmt.read_index(built)
    points = {r["file"]: r["points"] for rs in index.section("ct")["records"].values() for r in rs}
    cap = max(points.values()) + 5000
    everything = set(volumes(list(ShardDataset(built, sample="ct", batch_size=9, shuffle=False))))
    for epoch in range(3):
        per_rank = []
        for rank in range(2):
            ds = ShardDataset(
                built,
                sample="ct",
                max_points_per_batch=cap,
                seed=1,
                rank=rank,
                world_size=2,
                decode_process=False,
            )
            ds.set_epoch(epoch)
            batches = list(ds)
            assert len(batches) == len(ds)
            for b in batches:
                assert b["coords"].shape[0] <= cap
            per_rank.append([i for b in batches for i in b["sample_id"].tolist()])
            again = ShardDataset(
                built, sample="ct", max_points_per_batch=cap, seed=1, rank=rank, world_size=2
            )
            again.set_epoch(epoch)
            assert [i for b in again for i in b["sample_id"].tolist()] == per_rank[
                -1
            ]  # deterministic
        assert len(set(per_rank[0]) & set(per_rank[1])) == 0
        assert sorted(per_rank[0] + per_rank[1]) == sorted(
            everything
        )  # every volume once per epoch
        assert len(
            ShardDataset(built, sample="ct", max_points_per_batch=cap, rank=0, world_size=2)
        ) == len(ShardDataset(built, sample="ct", max_points_per_batch=cap, rank=1, world_size=2))
    one = ShardDataset(built, sample="ct", max_points_per_batch=10**9, shuffle=False)
    assert [b["sample_id"].tolist() for b in one] == [
        sorted(everything)
    ]  # all in one batch, index order
    with pytest.raises(ValueError, match="below the largest volume"):
        ShardDataset(built, sample="ct", max_points_per_batch=10)


def test_budget_plan_follows_the_served_order(built: Path) -> None:
    """The plan is made from index.json's point counts in the epoch's shuffled order; the batches
    served must be that order, cut greedily (world 1: no splits), with the real points of every
    batch within the budget. A plan made from another order or epoch than the one served would
    break one of these."""
    index = fmt.read_index(built)
    points_of = {
        r["file"]: r["points"] for rs in index.section("ct")["records"].values() for r in rs
    }
    points = {
        i: points_of[Path(s["path"]).name]
        for i, s in enumerate(index.sources)
        if Path(s["path"]).name in points_of
    }
    cap = max(points.values()) + min(points.values())  # some pairs fit, some do not
    for seed in range(4):
        for epoch in range(2):
            one = ShardDataset(built, sample="ct", batch_size=1, seed=seed, decode_process=False)
            one.set_epoch(epoch)
            order_ids = [i for b in one for i in b["sample_id"].tolist()]
            ds = ShardDataset(
                built, sample="ct", max_points_per_batch=cap, seed=seed, decode_process=False
            )
            ds.set_epoch(epoch)
            batches = list(ds)
            ids = [b["sample_id"].tolist() for b in batches]
            assert [i for b in ids for i in b] == order_ids and len(batches) == len(ds)
            for k, (b, sids) in enumerate(zip(batches, ids, strict=True)):
                assert (
                    int(b["offsets"][-1])
                    == b["coords"].shape[0]
                    == sum(points[i] for i in sids)
                    <= cap
                )
                if k + 1 < len(ids):  # greedy: the next volume would not have fitted
                    assert sum(points[i] for i in sids) + points[ids[k + 1][0]] > cap


@pytest.mark.process
@pytest.mark.parametrize("workers", [0, 2])
def test_crop_flip_and_torchsparse_layout(built: Path, workers: int) -> None:
    kw: dict[str, Any] = dict(sample="ct", batch_size=2, seed=3, crop=(40, 30, 16), flip=True)
    loader = ShardLoader(ShardDataset(built, **kw), num_workers=workers, timeout=TIMEOUT)
    loader.set_epoch(1)
    a = list(loader)
    b = list(
        ShardDataset(built, **kw, batch_dim="last")
    )  # same seed, epoch 0 vs 1 differ; layout differs
    ref = ShardDataset(built, **kw)
    ref.set_epoch(1)
    for x, y in zip(a, list(ref), strict=True):  # workers 0/2 give the same augmented batches
        for k in ("coords", "feats", "offsets", "sample_id", "shape"):
            assert (x[k] == y[k]).all()
    for batch in a:
        c = batch["coords"].numpy()
        assert np.all(c[:, 1:] >= 0) and np.all(
            c[:, 1:] < np.minimum(batch["shape"].numpy(), (40, 30, 16))[c[:, 0]]
        )
    assert all(np.all(np.diff(bb["coords"][:, 3].numpy()) >= 0) for bb in b)  # batch index last
    epoch0 = volumes(
        list(ShardDataset(built, **kw))
    )  # a fresh dataset starts at epoch 0: new draws
    assert any(not np.array_equal(epoch0[s][0], v[0]) for s, v in volumes(a).items())
    uncropped = volumes(list(ShardDataset(built, sample="ct", batch_size=2)))
    cropped = volumes(a)
    assert all(len(cropped[s][0]) <= len(uncropped[s][0]) for s in cropped)
    assert sum(len(v[0]) for v in cropped.values()) < sum(len(v[0]) for v in uncropped.values())


def test_folder_source_and_verify_check(tmp_path: Path, ct_npy: Any) -> None:
    write_ct_demo(tmp_path)
    out = ct_npy.make(
        tmp_path, path='ct"\ntype = "npy'
    )  # a folder (type given) stands for its .npy files, sorted
    m = load_manifest(tmp_path / "m.toml")
    assert [s.path.name for s in m.sources] == [
        "chest_000.npy",
        "chest_001.npy",
        "chest_002.npy",
        "chest_003.npy",
    ]
    kind = get_kind("ct")
    cols = {
        "coords/offsets": np.array([0, 2]),
        "coords/values": np.array([[0, 0, 0], [5, 1, 1]], np.uint16),
        "volume_shape": np.array([[4, 4, 4]], np.int32),
        "window/values": np.array([0.5, 1.5], np.float16),
    }
    problems = kind.check_shard(fmt.read_index(out), cols)
    assert (
        kind.check_shard(
            fmt.read_index(out),
            {
                **cols,
                "coords/values": cols["coords/values"] % 4,
                "window/values": np.zeros(2, np.float16),
            },
        )
        == []
    )
    assert any("outside their volume's shape" in p for p in problems)
    assert any("outside [0, 1]" in p for p in problems)


@pytest.fixture(scope="module")
def conformance_tar(tmp_path_factory: pytest.TempPathFactory, ct_npy: Any) -> Path:
    root = tmp_path_factory.mktemp("ct-conf")
    write_sources(root)
    return ct_npy.make(root, "tar", extra="min_points = 10")


class TestCt(SampleTypeTests):
    name = "ct"

    @pytest.fixture
    def dataset(self, conformance_tar: Path) -> Path:
        return conformance_tar

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return batch["sample_id"].tolist()


class TestCtAugmented(SampleTypeTests):
    """The same conformance with crops, flips and torchsparse's layout (units and order do not
    change)."""

    name = "ct"
    options = {"crop": 48, "flip": [True, False, True], "batch_dim": "last"}

    @pytest.fixture
    def dataset(self, built: Path) -> Path:
        return built

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return batch["sample_id"].tolist()
