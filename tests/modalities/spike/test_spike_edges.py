"""Spike modality corners that tests/modalities/spike/test_spike.py leaves out: GoPro trees without train/test
folders (splits drawn per sequence), one-byte-per-pixel files with a width that is not a multiple
of 8 and ``frames = "all"``, images at a non-integer scale of the spikes, and the GPU benchmark's
parity check (dry run on the CPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from loaders.format import read_index
from loaders.modalities.spike.samples import Spike
from pipeline.build import build
from pipeline.modalities.spike.demo import (
    FRAMES,
    HEIGHT,
    WIDTH,
    integrate_and_fire,
    scene,
    vidar_bytes,
)
from pipeline.verify import verify


def _manifest(
    path: Path, source: str, spike: str, fmt: str = "zarr", extra: str = "", shard_mb: float = 0.05
) -> Path:
    path.write_text(
        f'[dataset]\nname = "t"\nkind = "spike"\nformat = "{fmt}"\nseed = 0\nshard_size_mb = {shard_mb}\n\n'
        f'[[sources]]\npath = "{source}"\ntype = "dat"\n\n[spike]\n{spike}\n{extra}'
    )
    return path


def _spikes(seed: int, frames: int = FRAMES, h: int = HEIGHT, w: int = WIDTH) -> np.ndarray:
    return integrate_and_fire(scene(np.arange(frames) + 3 * seed, h, w, seed), seed=seed)


def test_a_gopro_tree_without_split_folders_splits_by_sequence(tmp_path: Path) -> None:
    """No train/test folders: [split] fractions are drawn per sequence, so a sequence lies in one
    split only (and every record of it is there)."""
    tree = tmp_path / "GOPRO"
    for s in range(12):
        for f in range(3):
            p = tree / f"seq{s:02d}" / "spike" / f"{f:06d}.dat"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(vidar_bytes(_spikes(s * 10 + f)))
    m = _manifest(
        tmp_path / "m.toml",
        str(tree),
        f'height = {HEIGHT}\nwidth = {WIDTH}\nlayout = "gopro"\nclip_len = 3',
        extra="\n[split]\nval_fraction = 0.25\ntest_fraction = 0.25\n",
        shard_mb=0.2,
    )  # a 3-frame sequence (90 KB) fits a shard: its clip is whole
    build(m, tmp_path / "out", progress=False)
    assert verify(tmp_path / "out") == []
    seq_of = {i: p.parent.parent.name for i, p in enumerate(sorted(tree.rglob("*.dat")))}
    where: dict[str, set[str]] = {}
    splits = {e.split for e in read_index(tmp_path / "out").shards}
    for split in splits:
        for b in ShardDataset(
            tmp_path / "out", split=split, sample="spike", batch_size=4, shuffle=False
        ):
            for clip in b["sample_id"].tolist():
                assert sorted(clip) == list(
                    range(clip[0], clip[0] + 3)
                )  # a whole sequence, in order
                for sid in clip:
                    where.setdefault(seq_of[sid], set()).add(split)
    assert len(where) == 12 and all(len(s) == 1 for s in where.values())
    assert len(splits) >= 2  # the fractions did draw sequences away from train


@pytest.mark.parametrize("fmt", ["zarr", "tar"])
def test_bytes_packing_odd_width_and_all_frames(tmp_path: Path, fmt: str) -> None:
    """packing = "bytes", no flip, width 90 (stored bits padded to 12 bytes a row), frames = "all":
    voxels equal the frames binned, cropped anywhere (also across the padded last byte); a file
    with another frame count is a counted skip, not a wrong-shaped record."""
    h, w, t = 20, 90, 24
    data = tmp_path / "files"
    data.mkdir()
    frames = {}
    for k in range(5):
        frames[k] = _spikes(k, t, h, w)
        (data / f"r{k}.dat").write_bytes(frames[k].tobytes())
    (data / "r5.dat").write_bytes(
        _spikes(5, t + 4, h, w).tobytes()
    )  # 28 frames: not the dataset's 24
    m = _manifest(
        tmp_path / "m.toml",
        f"{data}/*.dat",
        f'height = {h}\nwidth = {w}\npacking = "bytes"\n'
        'flip_rows = false\nframes = "all"\nnum_bins = 4\nlayout = "files"',
        fmt,
        "\n[split]\nval_fraction = 0\ntest_fraction = 0\n",
    )
    res = build(m, tmp_path / "out", progress=False)
    assert res.index["stats"]["skipped"] == {
        'frame count differs from the dataset\'s (frames = "all")': 1
    }
    assert verify(tmp_path / "out") == []
    for crop in (None, (7, 13), (h, w)):
        ds = ShardDataset(
            tmp_path / "out",
            split="train",
            sample="spike",
            batch_size=2,
            crop=crop,
            num_bins=6,
            seed=4,
        )
        seen = []
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            for b in ShardLoader(ds, num_workers=0):
                for i, (sid,) in enumerate(b["sample_id"].tolist()):
                    y, x = b["crop"][i].tolist()
                    ch, cw = crop or (h, w)
                    want = (
                        frames[sid]
                        .astype(np.float32)
                        .reshape(6, -1, h, w)
                        .sum(1)[:, y : y + ch, x : x + cw]
                    )
                    np.testing.assert_array_equal(b["voxel"][i, 0].numpy(), want)
                    seen.append(sid)
        assert sorted(set(seen)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("shape", [(375, 600), (625, 1000), (720, 1280), (500, 800)])
def test_images_crop_inside_the_image_at_any_scale(shape: tuple[int, int]) -> None:
    """Images 1.5x / 2.5x / 2.88x / 2x the spike size: the scaled crop window lies inside the image
    for every offset the spike crop can take (rounding the offset and the size separately must
    not run past the edge) and starts where the spike crop starts, scaled."""
    sp = Spike(crop=(5, 7))
    sp.size = (250, 400)
    img = np.arange(3 * shape[0] * shape[1], dtype=np.uint32).reshape(1, 3, *shape)
    img = (img % 251).astype(np.uint8)
    sy, sx = shape[0] / 250, shape[1] / 400
    ys = np.arange(0, 250 - 5 + 1)
    offsets = np.stack([ys, np.minimum(ys, 400 - 7)], axis=1)
    out = sp._images(np.repeat(img, len(ys), axis=0), offsets, len(ys), 1)
    hh, ww = out.shape[-2:]
    assert (hh, ww) == (round(5 * sy), round(7 * sx))
    for i, (y, x) in enumerate(offsets.tolist()):
        y0, x0 = min(round(y * sy), shape[0] - hh), min(round(x * sx), shape[1] - ww)
        np.testing.assert_array_equal(
            out[i, 0], img[0, :, y0 : y0 + hh, x0 : x0 + ww] / np.float32(255)
        )


@pytest.mark.bench  # a test of the benchmark harness (benchmarks/gpu_spike.py)
def test_gpu_bench_dry_run_checks_parity_and_fails_on_a_wrong_finisher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from benchmarks import gpu_spike
    from loaders.modalities.spike import torch_ops as spike_torch

    if not _cuda():  # never a CPU timing passed off as a GPU one
        assert gpu_spike.run_gpu_spike(tmp_path / "none") == {"status": gpu_spike.NOT_MEASURED}
    cases = gpu_spike.CASES[
        1:3
    ]  # a 128x128 crop of single frames, an odd crop of 3-frame clips (fast)
    rows = gpu_spike.kernel("cpu", repeats=1, cases=cases)
    assert [r["equal"] for r in rows] == [True] * len(cases) * 4  # 2 bin counts x 2 bit orders
    root = gpu_spike.demo_build(tmp_path / "w")
    assert all(
        p["equal"] and p["batches"] > 0 for p in gpu_spike.loader_parity(root, "cpu", workers=(0,))
    )
    for name in ("voxel_torch", "voxel_pixel_torch"):
        real = getattr(spike_torch, name)
        with monkeypatch.context() as m:
            m.setattr(spike_torch, name, lambda *a, real=real: real(*a).roll(1, dims=-1))
            with pytest.raises(gpu_spike.ParityError, match="differs from voxel_numpy"):
                gpu_spike.kernel("cpu", repeats=1, cases=cases)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_clips_lost_where_a_shard_cuts_a_sequence_are_counted(tmp_path: Path) -> None:
    """Clips are a per-shard table: a sequence longer than a shard loses the clips across the cut.
    They are not lost silently: index.json stats say how many (and the build logs it)."""
    tree = tmp_path / "GOPRO"
    for s in range(2):
        for f in range(5):
            p = tree / "train" / f"seq{s}" / "spike" / f"{f:06d}.dat"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(vidar_bytes(_spikes(s * 10 + f)))
    spike = f'height = {HEIGHT}\nwidth = {WIDTH}\nlayout = "gopro"\nclip_len = 3'
    stored = {}
    for mb in (
        0.2,
        0.07,
    ):  # a 5-frame sequence is 150 KB: whole in 0.2 MB shards, cut in 0.07 MB ones
        res = build(
            _manifest(tmp_path / f"m{mb}.toml", str(tree), spike, shard_mb=mb),
            tmp_path / f"o{mb}",
            progress=False,
        )
        index = read_index(tmp_path / f"o{mb}")
        stored[mb] = sum(e.units["spike"] for e in index.shards)
        assert (
            stored[mb] + res.index["stats"]["clips_lost_at_shard_cuts"] == 2 * 3
        )  # 3 clips per sequence
    assert stored[0.2] == 6 and stored[0.07] < 6


@pytest.mark.parametrize("name", ["gopro_spike.toml", "spike_folder.toml"])
def test_the_example_manifests_load(name: str, tmp_path: Path) -> None:
    """The commented examples stay valid manifests (their paths pointed at a tiny tree of the right
    shape)."""
    from pipeline.manifest import load_manifest

    text = (
        Path(__file__).resolve().parents[3] / "data_manifests" / "examples" / name
    ).read_text()
    dat = tmp_path / "train" / "seq0" / "spike" / "000000.dat"
    dat.parent.mkdir(parents=True)
    dat.write_bytes(bytes(250 * 400 * 40))  # 40 one-byte frames (= 320 bit-packed ones)
    text = text.replace('"/data/GOPRO_spike"', f'"{tmp_path}"').replace(
        '"/data/spike_recordings/*.dat"', f'"{dat.parent}/*.dat"'
    )
    (tmp_path / name).write_text(text)
    m = load_manifest(tmp_path / name)
    assert m.kind == "spike" and m.config.height == 250 and [s.path for s in m.sources] == [dat]
