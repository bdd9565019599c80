"""Pixel-major spike windows (the default bit order): the voxel ops (numpy popcount / unpack and
their torch twins, run on CPU tensors) and the loader over pixel-major and frame-major builds,
zarr and tar, num_workers 0 and 2, all equal to ``frames.reshape(bins, -1, H, W).sum(1)`` of the
window, cropped; frames per bin a multiple of 8 (8, 16, 40: popcount) and not (9, 10, 12:
unpack); old indexes without ``bit_order`` read frame-major."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numcodecs
import numpy as np
import pytest
import torch

from loaders import ShardDataset, ShardLoader
from loaders import format as fmt
from loaders.format.readers import read_shard
from loaders.modalities.spike.ops import (
    POPCOUNT,
    crop_pixels,
    pack_pixel_major,
    popcount,
    voxel_pixel_numpy,
)
from loaders.modalities.spike.samples import crop_bits, crop_offsets, voxel_numpy
from loaders.modalities.spike.torch_ops import popcount8, voxel_pixel_torch, voxel_torch
from pipeline.build import build
from pipeline.modalities.spike.demo import vidar_bytes

H, W, FILE_FRAMES = 12, 42, 50  # W not a multiple of 8: the frame-major rows end in a partial byte


def _frames(n: int, t: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((n, t, H, W)) < 0.3).astype(np.uint8)


def _want(
    frames: np.ndarray, offsets: np.ndarray, crop: tuple[int, int] | None, bins: int, clip_len: int
) -> np.ndarray:
    """The reference: every window's frames summed per bin, then cropped at its unit's place."""
    h, w = crop or (H, W)
    out = []
    for i, f in enumerate(frames):
        y, x = offsets[i // clip_len].tolist()
        out.append(f.reshape(bins, -1, H, W).sum(1)[:, y : y + h, x : x + w])
    return np.array(out, np.float32).reshape(-1, clip_len, bins, h, w)


def test_pack_pixel_major_layout_and_popcounts() -> None:
    f = _frames(1, 19, 3)[0]
    p = pack_pixel_major(f)
    assert p.shape == (H, W, 3)
    for k in range(3):  # byte k of pixel (y, x): frames 8k..8k+7, LSB first; past T: zeros
        chunk = np.zeros((8, H, W), np.uint8)
        chunk[: min(8, 19 - 8 * k)] = f[8 * k : 8 * k + 8]
        np.testing.assert_array_equal(
            p[..., k], (chunk << np.arange(8, dtype=np.uint8)[:, None, None]).sum(0)
        )
    x = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(POPCOUNT, np.unpackbits(x[:, None], axis=1).sum(1))
    np.testing.assert_array_equal(popcount8(torch.from_numpy(x)).numpy(), POPCOUNT)
    np.testing.assert_array_equal(popcount(x.reshape(16, 16)), POPCOUNT.reshape(16, 16))


def test_voxels_without_numpys_popcount_ufunc(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy < 2.0 has no ``bitwise_count``: the table gives the same voxels."""
    frames = _frames(2, 40, 41)
    pixel = crop_pixels([pack_pixel_major(f) for f in frames], np.zeros((2, 2), np.int64), None, 1)
    want = voxel_pixel_numpy(pixel, 40, 5, 1)
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    np.testing.assert_array_equal(voxel_pixel_numpy(pixel, 40, 5, 1), want)
    np.testing.assert_array_equal(want, _want(frames, np.zeros((2, 2), np.int64), None, 5, 1))


@pytest.mark.parametrize(
    "t, bins", [(40, 5), (48, 3), (40, 1), (40, 4), (36, 4)]
)  # frames/bin 8 16 40 10 9
@pytest.mark.parametrize("clip_len", [1, 3])
@pytest.mark.parametrize("crop", [None, (5, 13)])
def test_voxel_ops_equal_the_binned_window(
    t: int, bins: int, clip_len: int, crop: tuple[int, int] | None
) -> None:
    frames = _frames(2 * clip_len, t, t + bins)
    offsets = crop_offsets(7, 1, np.arange(2), (H, W), crop)
    want = _want(frames, offsets, crop, bins, clip_len)
    pixel = crop_pixels([pack_pixel_major(f) for f in frames], offsets, crop, clip_len)
    np.testing.assert_array_equal(voxel_pixel_numpy(pixel, t, bins, clip_len), want)
    np.testing.assert_array_equal(
        voxel_pixel_torch(torch.from_numpy(pixel), t, bins, clip_len).numpy(), want
    )
    bits, left = crop_bits(
        list(np.packbits(frames, axis=-1, bitorder="little")), offsets, crop, clip_len
    )
    w = crop[1] if crop else W
    np.testing.assert_array_equal(voxel_numpy(bits, left, w, bins, clip_len), want)
    np.testing.assert_array_equal(
        voxel_torch(torch.from_numpy(bits), torch.from_numpy(left), w, bins, clip_len).numpy(), want
    )


# -- builds
# ----------------------------------------------------------------------------------------------
MANIFEST = """[dataset]
name = "pm"
kind = "spike"
seed = 0
codec = "none"

[[sources]]
path = "{data}/*.dat"
type = "dat"

[spike]
height = {h}
width = {w}
frames = {t}
num_bins = 1
codec = "{codec}"
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    root = tmp_path_factory.mktemp("spike_pixel")
    frames = _frames(8, FILE_FRAMES, 11)
    (root / "data").mkdir()
    for i, f in enumerate(frames):
        (root / "data" / f"r{i}.dat").write_bytes(vidar_bytes(f))
    return root, frames


@pytest.fixture(scope="module")
def builds(corpus: tuple[Path, np.ndarray]) -> dict[tuple[int, str, str], Path]:
    """(window frames, [spike] codec, encoding) -> the built dataset (one record a unit: clip_len
    1)."""
    root, _ = corpus
    out = {}
    for t in (48, 36):
        for codec, enc in (
            ("spikebits", "zarr"),
            ("spikebits", "tar"),
            ("dataset", "zarr"),
            ("spikebits-v1", "tar"),
        ):
            m = root / f"{t}-{codec}.toml"
            m.write_text(MANIFEST.format(data=root / "data", h=H, w=W, t=t, codec=codec))
            out[t, codec, enc] = root / f"out-{t}-{codec}-{enc}"
            build(m, out[t, codec, enc], jobs=1, progress=False, encoding=enc)
    return out


# frames per bin 16, 8, 12 (workers 0), 8 (workers 2), 9 with a padded last byte (workers 2)
# DataLoader workers (num_workers=2) are processes: those cases run in the process lane
CASES = [
    (48, 3, 0),
    (48, 6, 0),
    (48, 4, 0),
    pytest.param(48, 6, 2, marks=pytest.mark.process),
    pytest.param(36, 4, 2, marks=pytest.mark.process),
]


@pytest.mark.parametrize("t, bins, workers", CASES)
@pytest.mark.parametrize(
    "variant",
    [("spikebits", "zarr"), ("spikebits", "tar"), ("dataset", "zarr"), ("spikebits-v1", "tar")],
)
def test_loader_voxels_equal_the_binned_window(
    builds: dict[tuple[int, str, str], Path],
    corpus: tuple[Path, np.ndarray],
    t: int,
    bins: int,
    workers: int,
    variant: tuple[str, str],
) -> None:
    frames = corpus[1]
    start = (FILE_FRAMES - t) // 2
    root = builds[(t, *variant)]
    index = fmt.read_index(root)
    assert index.section()["bit_order"] == (
        "pixel_major" if variant[0] == "spikebits" else "frame_major"
    )
    seen = set()
    for split in sorted({e.split for e in index.shards}):
        ds = ShardDataset(
            root, split=split, sample="spike", batch_size=3, crop=(7, 30), num_bins=bins, seed=4
        )
        for b in ShardLoader(ds, num_workers=workers):
            for i, sid in enumerate(b["sample_id"][:, 0].tolist()):
                y, x = b["crop"][i].tolist()
                want = (
                    frames[sid, start : start + t]
                    .reshape(bins, -1, H, W)
                    .sum(1)[:, y : y + 7, x : x + 30]
                )
                np.testing.assert_array_equal(b["voxel"][i, 0].numpy(), want)
                seen.add(sid)
    assert seen == set(range(8))


def test_pixel_major_tar_members_are_plain_zstd(
    builds: dict[tuple[int, str, str], Path], corpus: tuple[Path, np.ndarray]
) -> None:
    """A tar's spikes members decode with plain numcodecs zstd into the documented layout."""
    import tarfile

    frames, root = corpus[1], builds[(36, "spikebits", "tar")]
    index = fmt.read_index(root)
    assert index.field("spikes").codec == {"id": "zstd", "level": 5}
    assert index.field("spikes").shape == (H, W, 5) and index.section()["window_frames"] == 36
    got, ids = [], []
    for e in index.shards:
        path = index.shard_path(e)
        ids.append(read_shard(path, "tar", [fmt.SAMPLE_ID])[fmt.SAMPLE_ID])
        with tarfile.open(path) as tf:
            members = sorted(
                (m for m in tf.getmembers() if m.name.endswith(".spikes.npy")), key=lambda m: m.name
            )
            for m in members:
                raw = np.load(io.BytesIO(tf.extractfile(m).read()))  # type: ignore[union-attr]
                got.append(
                    np.frombuffer(numcodecs.Zstd().decode(raw.tobytes()), np.uint8).reshape(
                        -1, H, W, 5
                    )
                )
    stored, order = np.concatenate(got), np.concatenate(ids)
    assert sorted(order.tolist()) == list(range(8))
    want = np.stack([pack_pixel_major(frames[s, 7:43]) for s in order])
    np.testing.assert_array_equal(stored, want)


def _strip_bit_order(src: Path, dst: Path, order: str | None) -> Path:
    shutil.copytree(src, dst)
    doc = json.loads((dst / fmt.INDEX_FILE).read_text())
    sec = doc["sections"]["spike"] if "sections" in doc else doc["section"]
    for key in ("bit_order", "window_frames"):
        sec.pop(key, None)
    if order is not None:
        sec["bit_order"] = order
    doc["digest"] = fmt.index_digest(doc)  # as the older build sealed it
    (dst / fmt.INDEX_FILE).write_text(json.dumps(doc))
    return dst


def test_an_index_without_bit_order_reads_frame_major_and_an_unknown_one_is_refused(
    builds: dict[tuple[int, str, str], Path], tmp_path: Path
) -> None:
    def batches(root: Path) -> list[np.ndarray]:
        ds = ShardDataset(
            root, split="train", sample="spike", batch_size=4, crop=(5, 9), num_bins=4, seed=1
        )
        return [np.asarray(b["voxel"]) for b in ds]

    old = _strip_bit_order(
        builds[(48, "spikebits-v1", "tar")], tmp_path / "old", None
    )  # as written before
    want = batches(builds[(48, "spikebits", "zarr")])
    got = batches(old)
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    bad = _strip_bit_order(builds[(48, "dataset", "zarr")], tmp_path / "bad", "time_reversed")
    with pytest.raises(
        fmt.FormatError, match="bit_order 'time_reversed' is unknown.*upgrade shardsmith"
    ):
        ShardDataset(bad, split="train", sample="spike")
