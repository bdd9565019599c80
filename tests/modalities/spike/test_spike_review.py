"""Spike modality, checked against issue 10 by a second reader: records that the clips table would
leave unreachable (frame files without numbers, frame gaps, sequences shorter than a clip) are
counted, ``inspect`` reports what every record kind reports, a bad byte stops a parallel build
with the file and offset, grey images are stored ``[1, H, W]``, and the shards do not depend on
``--jobs``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from loaders import ShardDataset
from loaders.format import read_index
from pipeline.build import build
from pipeline.errors import SourceError
from pipeline.modalities.spike.demo import (
    FRAMES,
    HEIGHT,
    WIDTH,
    _png,
    integrate_and_fire,
    scene,
    vidar_bytes,
    write_spike_demo,
)
from pipeline.model import get_kind
from pipeline.verify import verify

RES = f"height = {HEIGHT}\nwidth = {WIDTH}\n"


def _manifest(path: Path, source: str, spike: str, fmt: str = "zarr", mb: float = 1.0) -> Path:
    path.write_text(
        f'[dataset]\nname = "r"\nkind = "spike"\nformat = "{fmt}"\nseed = 0\nshard_size_mb = {mb}\n\n'
        f'[[sources]]\npath = "{source}"\ntype = "dat"\n\n[spike]\n{spike}\n'
    )
    return path


def _spikes(seed: int) -> np.ndarray:
    return integrate_and_fire(scene(np.arange(FRAMES) + 3 * seed, HEIGHT, WIDTH, seed), seed=seed)


def _sequence(folder: Path, names: list[str]) -> None:
    (folder / "spike").mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(names):
        (folder / "spike" / f"{name}.dat").write_bytes(vidar_bytes(_spikes(k)))


def _loaded(out: Path, split: str = "train") -> list[list[int]]:
    """Every unit the loader gives, as its records' frame numbers, in index order."""
    return [
        c
        for b in ShardDataset(out, split=split, sample="spike", batch_size=4, shuffle=False)
        for c in b["frame"].tolist()
    ]


def test_frame_files_without_numbers_are_ordered_by_name_and_make_clips(tmp_path: Path) -> None:
    """``frame_a.dat, frame_b.dat, ...``: the frame number is the file's position in its sequence
    (sorted by name), so consecutive files make clips; they must not all get one number and
    silently form no clip."""
    _sequence(tmp_path / "tree" / "train" / "seqA", ["frame_a", "frame_b", "frame_c", "frame_d"])
    m = _manifest(
        tmp_path / "m.toml", str(tmp_path / "tree"), RES + 'layout = "gopro"\nclip_len = 2'
    )
    build(m, tmp_path / "out", progress=False)
    assert verify(tmp_path / "out") == []
    assert _loaded(tmp_path / "out") == [[0, 1], [1, 2], [2, 3]]


def test_records_no_clip_can_reach_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A frame gap (0 1 2 _ 4 5) and a one-frame sequence leave 3 of 6 records in no 3-frame clip:
    the loader can never give them, so the index says how many (nothing lost silently) and the
    build logs it."""
    _sequence(tmp_path / "tree" / "train" / "s1", [f"{f:06d}" for f in (0, 1, 2, 4, 5)])
    _sequence(tmp_path / "tree" / "train" / "s2", ["000000"])
    m = _manifest(
        tmp_path / "m.toml", str(tmp_path / "tree"), RES + 'layout = "gopro"\nclip_len = 3'
    )
    with caplog.at_level("WARNING"):
        res = build(m, tmp_path / "out", progress=False)
    assert _loaded(tmp_path / "out") == [[0, 1, 2]]
    assert res.index["stats"]["records_in_no_clip"] == 3
    assert read_index(tmp_path / "out").stats["records_in_no_clip"] == 3
    assert any("in no clip" in r.getMessage() for r in caplog.records)
    assert (
        get_kind("spike").describe(read_index(tmp_path / "out"))["records in no clip"] == 3
    )  # inspect says it


@pytest.fixture(scope="module")
def demo_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The demo tree built with --jobs 1 and --jobs 2 (zarr)."""
    root = tmp_path_factory.mktemp("spike_review")
    write_spike_demo(root / "data" / "demo")
    text = (
        Path(__file__).resolve().parents[3] / "data_manifests" / "demo_spike.toml"
    ).read_text()
    m = root / "demo_spike.toml"
    m.write_text(text.replace('"../data/demo/spike"', f'"{root / "data" / "demo" / "spike"}"'))
    return {
        j: build(m, root / f"out{j}", jobs=j, progress=False).index and root / f"out{j}"
        for j in (1, 2)
    }


def test_inspect_reports_records_and_groups_per_split(demo_builds: dict[int, Path]) -> None:
    """What ``inspect`` says of every record kind (records scanned, groups per split) plus the spike
    facts."""
    index = read_index(demo_builds[1])
    kind = get_kind("spike")
    summary = kind.describe(index)
    assert summary["records scanned"] == 30
    assert summary["groups per split"]["train"] == 3 and summary["groups per split"]["test"] == 2
    assert summary["resolution"] == f"{HEIGHT}x{WIDTH}"
    lines = "\n".join(kind.describe_lines(summary))
    assert "records scanned: 30" in lines and "train=3" in lines
    assert not any(
        k in summary for k in ("records in no clip", "images without spikes")
    )  # none happened


def test_shards_are_byte_identical_whatever_the_jobs(demo_builds: dict[int, Path]) -> None:
    def digests(out: Path) -> dict[str, str]:
        return {
            str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "index.json"
        }

    one = digests(demo_builds[1])
    assert len(one) > 10 and one == digests(demo_builds[2])


def test_a_bad_byte_stops_a_parallel_build_naming_file_and_offset(tmp_path: Path) -> None:
    """packing = "bytes": a 7 inside the kept window, read in a pack worker (--jobs 2), is a
    SourceError that names the file and the byte's offset in it (not a bare traceback from the
    worker)."""
    (tmp_path / "d").mkdir()
    for k in range(3):
        a = _spikes(k)
        if k == 1:
            a[20, 3, 5] = 7
        (tmp_path / "d" / f"r{k}.dat").write_bytes(a.tobytes())
    m = _manifest(
        tmp_path / "m.toml",
        f"{tmp_path / 'd'}/*.dat",
        RES + 'packing = "bytes"\nflip_rows = false\nlayout = "files"',
    )
    offset = 20 * HEIGHT * WIDTH + 3 * WIDTH + 5
    with pytest.raises(SourceError, match=rf"r1\.dat: byte 7 at offset {offset} is not 0 or 1"):
        build(m, tmp_path / "out", jobs=2, progress=False)


@pytest.mark.parametrize("fmt", ["zarr", "tar"])
def test_grey_images_are_stored_with_one_channel_and_cropped_at_scale(
    tmp_path: Path, fmt: str
) -> None:
    seq = tmp_path / "tree" / "train" / "seq"
    _sequence(seq, [f"{i:06d}" for i in range(3)])
    grey = {
        i: np.random.default_rng(i).integers(0, 256, (HEIGHT * 2, WIDTH * 2), dtype=np.uint8)
        for i in range(3)
    }
    for i, g in grey.items():
        _png(seq / "sharp" / f"{i:06d}.png", g)
    m = _manifest(
        tmp_path / "m.toml",
        str(tmp_path / "tree"),
        RES + 'layout = "gopro"\nimages = ["sharp"]',
        fmt,
    )
    build(m, tmp_path / "out", progress=False)
    assert read_index(tmp_path / "out").field("sharp").shape == (1, HEIGHT * 2, WIDTH * 2)
    b = next(
        iter(
            ShardDataset(
                tmp_path / "out",
                split="train",
                sample="spike",
                batch_size=3,
                shuffle=False,
                crop=(10, 12),
                seed=2,
            )
        )
    )
    assert tuple(b["sharp"].shape) == (3, 1, 1, 20, 24)
    for i, ((fr,), (y, x)) in enumerate(zip(b["frame"].tolist(), b["crop"].tolist(), strict=True)):
        want = grey[fr][2 * y : 2 * y + 20, 2 * x : 2 * x + 24] / np.float32(255)
        np.testing.assert_array_equal(b["sharp"][i, 0, 0].numpy(), want)


@pytest.mark.parametrize("fmt", ["zarr", "tar"])
def test_the_central_window_is_kept_and_a_short_file_is_a_counted_skip(
    tmp_path: Path, fmt: str
) -> None:
    """frames = 40 of streams of 50, 51 and 40 frames keeps frames [(T - 40) // 2, +40) of each (5,
    5, 0), seen through 40 one-frame bins; a 30-frame stream cannot give 40 and is a counted
    skip, not an error."""
    (tmp_path / "d").mkdir()
    streams = {}
    for k, t in enumerate((50, 51, 40, 30)):
        streams[k] = integrate_and_fire(scene(np.arange(t) + 11 * k, HEIGHT, WIDTH, k), seed=k)
        (tmp_path / "d" / f"r{k}.dat").write_bytes(vidar_bytes(streams[k]))
    m = _manifest(
        tmp_path / "m.toml", f"{tmp_path / 'd'}/*.dat", RES + 'frames = 40\nlayout = "files"', fmt
    )
    m.write_text(m.read_text() + "\n[split]\nval_fraction = 0\ntest_fraction = 0\n")
    res = build(m, tmp_path / "out", progress=False)
    assert res.index["stats"]["skipped"] == {"fewer frames than [spike] frames": 1}
    seen = set()
    for b in ShardDataset(
        tmp_path / "out", split="train", sample="spike", batch_size=2, num_bins=40
    ):
        for i, (sid,) in enumerate(b["sample_id"].tolist()):
            start = (streams[sid].shape[0] - 40) // 2
            np.testing.assert_array_equal(
                b["voxel"][i, 0].numpy(), streams[sid][start : start + 40]
            )
            seen.add(sid)
    assert seen == {0, 1, 2}


def test_unpaired_images_and_empty_sequences_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 10's bad input: a sequence with more images than spike files (a blur/sharp frame that
    no .dat pairs) and a sequence with images but an empty spike/ folder are counted in the index
    stats and logged (a spike file without its image is already a counted skip), never silently
    dropped."""
    tree = tmp_path / "tree" / "train"
    for seq, n_dat, n_img in (("full", 3, 3), ("extra", 2, 4), ("empty", 0, 2)):
        _sequence(tree / seq, [f"{i:06d}" for i in range(n_dat)])
        for i in range(n_img):
            for name in ("blur", "sharp"):
                _png(tree / seq / name / f"{i:06d}.png", np.zeros((HEIGHT, WIDTH, 3), np.uint8))
    m = _manifest(
        tmp_path / "m.toml",
        str(tmp_path / "tree"),
        RES + 'layout = "gopro"\nimages = ["blur", "sharp"]',
    )
    with caplog.at_level("WARNING"):
        res = build(m, tmp_path / "out", progress=False)
    assert res.index["stats"]["records"] == 5
    assert res.index["stats"]["images_without_spikes"] == {
        "blur": 4,
        "sharp": 4,
    }  # extra: 2 each, empty: 2 each
    assert res.index["stats"]["sequences_without_spikes"] == 1
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "empty" in text and "without a spike file" in text
    summary = get_kind("spike").describe(read_index(tmp_path / "out"))
    assert (
        summary["images without spikes"] == {"blur": 4, "sharp": 4}
        and summary["sequences without spikes"] == 1
    )
