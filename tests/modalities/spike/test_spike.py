"""Spike-camera modality: .dat reading (bit-exact against an independent reference), the spike
kind's shards, and the spike sample type's voxel grids, clips, crops and splits, on zarr and tar
builds."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaders import ShardDataset, ShardLoader
from loaders.format import read_index
from loaders.modalities.spike.samples import crop_bits, voxel_numpy
from loaders.modalities.spike.torch_ops import voxel_torch
from loaders.testing import SampleTypeTests
from pipeline.build import build
from pipeline.errors import ManifestError, SourceError
from pipeline.modalities.spike.dat import count_frames, read_frames
from pipeline.modalities.spike.demo import FRAMES, HEIGHT, WIDTH, write_spike_demo
from pipeline.verify import verify

MANIFESTS = Path(__file__).resolve().parents[3] / "data_manifests"


def reference_bits(frames: np.ndarray) -> bytes:
    """An independent writer of the Vidar layout: for every pixel, set bit (p % 8) of byte p // 8 of
    its frame, where p = row * W + col counts rows from the bottom (frames are stored upside
    down)."""
    t, h, w = frames.shape
    out = bytearray(t * h * w // 8)
    for f in range(t):
        for y in range(h):
            for x in range(w):
                if frames[f, y, x]:
                    p = (h - 1 - y) * w + x
                    out[f * h * w // 8 + p // 8] |= 1 << (p % 8)
    return bytes(out)


def reference_read(path: Path, h: int, w: int) -> np.ndarray:
    """Independent decode: shifts and masks instead of np.unpackbits, then the rows flipped back."""
    raw = np.fromfile(path, np.uint8).reshape(-1, h * w // 8)
    bits = (raw[:, :, None] >> np.arange(8, dtype=np.uint8)) & 1
    return bits.reshape(-1, h, w)[:, ::-1]


def test_bits_read_back_bit_exact(tmp_path: Path) -> None:
    frames = (np.random.default_rng(0).random((5, 6, 16)) < 0.3).astype(np.uint8)
    path = tmp_path / "a.dat"
    path.write_bytes(reference_bits(frames))
    assert count_frames(path, 6, 16, "bits") == 5
    np.testing.assert_array_equal(read_frames(path, 6, 16, "bits", True, 0, 5), frames)
    np.testing.assert_array_equal(read_frames(path, 6, 16, "bits", True, 2, 2), frames[2:4])
    assert not np.array_equal(read_frames(path, 6, 16, "bits", False, 0, 5), frames)  # flip matters


def test_bytes_packing_and_its_errors(tmp_path: Path) -> None:
    frames = (np.random.default_rng(1).random((10, 4, 8)) < 0.5).astype(np.uint8)
    path = tmp_path / "b.dat"
    path.write_bytes(frames.tobytes())
    np.testing.assert_array_equal(read_frames(path, 4, 8, "bytes", False, 0, 10), frames)
    bad = frames.copy()
    bad.reshape(-1)[77] = 2
    path.write_bytes(bad.tobytes())
    with pytest.raises(SourceError, match=r"b\.dat.*byte 2 at offset 77"):
        read_frames(path, 4, 8, "bytes", False, 0, 10)


def test_a_size_that_is_not_whole_frames_names_the_other_packing(tmp_path: Path) -> None:
    path = tmp_path / "c.dat"
    path.write_bytes(
        bytes(10 * 396 * 640)
    )  # 10 frames of bytes, read as bits by mistake? no: 80 bit-frames
    assert count_frames(path, 396, 640, "bits") == 80
    path.write_bytes(bytes(2_534_401))
    with pytest.raises(SourceError, match=r"c\.dat: size 2534401 .* packing='bytes' it would be"):
        count_frames(path, 396, 640, "bits")
    path.write_bytes(b"")
    with pytest.raises(SourceError, match="empty"):
        count_frames(path, 396, 640, "bits")


@pytest.mark.parametrize("crop", [None, (17, 21), (64, 96), (5, 90)])
def test_numpy_and_torch_voxels_are_equal(crop: tuple[int, int] | None) -> None:
    rng = np.random.default_rng(2)
    full = rng.integers(0, 256, (6, 40, 64, 12), dtype=np.uint8)  # B=3 clips of 2
    h, w = crop or (64, 96)
    offsets = np.stack([rng.integers(0, 64 - h + 1, 3), rng.integers(0, 96 - w + 1, 3)], axis=1)
    bits, left = crop_bits(list(full), offsets, crop, 2)
    a = voxel_numpy(bits, left, w, 5, 2)
    b = voxel_torch(torch.from_numpy(bits), torch.from_numpy(left), w, 5, 2).numpy()
    np.testing.assert_array_equal(a, b)
    frames = np.unpackbits(full, axis=-1, bitorder="little")  # independent: unpack all, then crop
    want = frames.reshape(3, 2, 5, 8, 64, 96).sum(3)
    for i, (y, x) in enumerate(offsets.tolist()):
        np.testing.assert_array_equal(a[i], want[i, :, :, y : y + h, x : x + w])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spike")
    write_spike_demo(root / "data" / "demo")
    (root / "m").mkdir()
    shutil.copy(MANIFESTS / "demo_spike.toml", root / "m" / "demo_spike.toml")
    return root


@pytest.fixture(scope="module", params=["zarr", "tar"])
def built(request: pytest.FixtureRequest, demo: Path) -> Path:
    out = demo / f"out-{request.param}"
    build(demo / "m" / "demo_spike.toml", out, jobs=2, progress=False, encoding=request.param)
    return out


def _windows(demo: Path) -> dict[int, tuple[str, np.ndarray]]:
    """sample_id -> (sequence folder, the kept 40 frames) from the .dat files, decoded
    independently."""
    files = sorted((demo / "data" / "demo" / "spike").rglob("*.dat"))
    return {
        i: (f.parent.parent.name, reference_read(f, HEIGHT, WIDTH)[:FRAMES])
        for i, f in enumerate(files)
    }


def test_build_verifies(built: Path) -> None:
    assert verify(built) == []


@pytest.mark.parametrize(
    "workers, bins",
    [
        (0, 4),
        pytest.param(2, 4, marks=pytest.mark.process),
        (0, 5),
        pytest.param(2, 5, marks=pytest.mark.process),
        (0, 1),
    ],
)  # 10, 8, 40 frames a bin
def test_voxels_equal_the_binned_window_cropped(
    built: Path, demo: Path, workers: int, bins: int
) -> None:
    windows = _windows(demo)
    seen = 0
    for split in ("train", "test"):
        ds = ShardDataset(
            built, split=split, sample="spike", batch_size=2, crop=(24, 40), num_bins=bins, seed=1
        )
        for b in ShardLoader(ds, num_workers=workers):
            for i in range(b["voxel"].shape[0]):
                y, x = b["crop"][i].tolist()
                for j, sid in enumerate(b["sample_id"][i].tolist()):
                    frames = windows[sid][1].astype(np.float32)
                    want = frames.reshape(bins, -1, HEIGHT, WIDTH).sum(1)[:, y : y + 24, x : x + 40]
                    np.testing.assert_array_equal(b["voxel"][i, j].numpy(), want)
                    seen += 1
                assert b["blur"].shape[-2:] == (48, 80)  # images are 2x the spike resolution
    assert seen > 0


def test_clips_never_cross_sequences_and_splits_never_share_one(built: Path, demo: Path) -> None:
    windows = _windows(demo)
    seqs: dict[str, set[str]] = {}
    for split in ("train", "test"):
        for b in ShardDataset(built, split=split, sample="spike", batch_size=3, shuffle=False):
            for clip, frames in zip(b["sample_id"].tolist(), b["frame"].tolist(), strict=True):
                assert len({windows[s][0] for s in clip}) == 1  # one sequence per clip
                assert np.all(np.diff(frames) == 1)  # consecutive frames
                seqs.setdefault(split, set()).update(windows[s][0] for s in clip)
    assert seqs["train"] and seqs["test"] and not seqs["train"] & seqs["test"]


def test_crop_is_reproducible_and_changes_with_the_epoch(built: Path) -> None:
    def crops(epoch: int) -> list[list[int]]:
        ds = ShardDataset(
            built, split="train", sample="spike", batch_size=4, crop=(16, 16), seed=3, shuffle=False
        )
        ds.set_epoch(epoch)
        return [c for b in ds for c in b["crop"].tolist()]

    assert crops(0) == crops(0) and crops(0) != crops(1)


def test_bad_num_bins_and_clip_len_are_clear_errors(built: Path) -> None:
    with pytest.raises(ValueError, match="num_bins=7 does not divide the 40"):
        ShardDataset(built, split="train", sample="spike", num_bins=7)
    with pytest.raises(ValueError, match=r"clip_len = 3.*rebuild"):
        ShardDataset(built, split="train", sample="spike", clip_len=2)


def test_files_layout_splits_by_file_and_counts_a_missing_image(demo: Path, tmp_path: Path) -> None:
    text = (demo / "m" / "demo_spike.toml").read_text()
    (tmp_path / "files.toml").write_text(
        text.replace('"../data/demo/spike"', f'"{demo}/data/demo/spike_files/*.dat"')
        .replace('layout = "gopro"', 'layout = "files"')
        .replace('images = ["blur", "sharp"]', "images = []")
        .replace("clip_len = 3", "clip_len = 1")
        + "\n[split]\ntest_fraction = 0.4\n"
    )
    build(tmp_path / "files.toml", tmp_path / "o1", progress=False)
    assert verify(tmp_path / "o1") == []
    ids = {
        sp: [
            i
            for b in ShardDataset(tmp_path / "o1", split=sp, sample="spike", batch_size=8)
            for i in b["sample_id"].reshape(-1).tolist()
        ]
        for sp in ("train", "val", "test")
        if any(e.split == sp for e in read_index(tmp_path / "o1").shards)
    }
    assert sorted(i for v in ids.values() for i in v) == list(range(8)) and ids["test"]
    tree = tmp_path / "tree"
    shutil.copytree(demo / "data" / "demo" / "spike", tree)
    next((tree / "train").glob("*/blur/000002.png")).unlink()
    (tmp_path / "g.toml").write_text(text.replace('"../data/demo/spike"', f'"{tree}"'))
    res = build(tmp_path / "g.toml", tmp_path / "o2", progress=False)
    assert res.index["stats"]["skipped"] == {"no blur image for the spike frame": 1}


def test_wrong_resolution_names_the_file_and_no_pillow_names_the_extra(
    demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        (demo / "m" / "demo_spike.toml")
        .read_text()
        .replace('"../data/demo/spike"', f'"{demo}/data/demo/spike"')
    )
    (tmp_path / "w.toml").write_text(text.replace("height = 64", "height = 63"))
    with pytest.raises(
        SourceError, match=r"000000\.dat: size .* not a whole number of 63x96 frames"
    ):
        build(tmp_path / "w.toml", tmp_path / "o", progress=False)
    (tmp_path / "ok.toml").write_text(text)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(
        ManifestError, match=r'spike\.images.*Pillow.*pip install -e "\.\[images\]"'
    ):
        build(tmp_path / "ok.toml", tmp_path / "o", progress=False)


class TestSpikeConformance(SampleTypeTests):
    name = "spike"
    options: dict[str, Any] = {"crop": (8, 8)}

    @pytest.fixture
    def dataset(self, built: Path) -> Path:
        return built

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return [tuple(r) for r in batch["sample_id"].tolist()]
