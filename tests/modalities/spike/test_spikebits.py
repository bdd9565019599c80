"""The ``shardsmith.spikebits`` codec (pixel-major spike bits + zstd) and per-field codecs in the
format: bit-exact round trips on awkward windows, determinism, clear errors for corrupt streams,
unknown codecs and bad configs, the index version gate, and builds with and without it giving the
same loader batches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numcodecs
import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from loaders import format as fmt
from loaders.format.readers import read_shard
from loaders.modalities.spike.bits import (
    CODEC_ID,
    SpikeBits,
    from_pixel_major,
    to_pixel_major,
    transpose8,
)
from loaders.modalities.spike.ops import pack_pixel_major
from pipeline.build import build
from pipeline.modalities.spike.demo import integrate_and_fire, scene, write_spike_demo

MANIFESTS = Path(__file__).resolve().parents[3] / "data_manifests"
CONFIG = {"id": CODEC_ID, "level": 5}


def spike_window(t: int = 40, h: int = 16, w: int = 24, seed: int = 0) -> np.ndarray:
    """A bit-packed integrate-and-fire window uint8 ``[t, h, ceil(w/8)]`` (w need not be a multiple
    of 8)."""
    frames = integrate_and_fire(scene(np.arange(t), h, w, seed), seed=seed)
    return np.packbits(frames, axis=-1, bitorder="little")


def windows() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "spikes": np.stack([spike_window(seed=s) for s in range(3)]),
        "random bytes": rng.integers(
            0, 256, (5, 40, 7, 3), dtype=np.uint8
        ),  # odd bytes per frame (21)
        "all zero": np.zeros((2, 40, 5, 4), np.uint8),
        "all one": np.full((2, 40, 5, 4), 255, np.uint8),
        "13 frames": rng.integers(0, 256, (3, 13, 9), dtype=np.uint8),  # T not a multiple of 8
        "1 frame": rng.integers(0, 256, (4, 1, 1), dtype=np.uint8),
        "no records": np.zeros((0, 40, 4, 2), np.uint8),
        "odd width": np.stack([spike_window(t=24, h=5, w=13, seed=1)]),
    }


@pytest.mark.parametrize("case", list(windows()))
def test_round_trip_is_bit_exact(case: str) -> None:
    a = windows()[case]
    codec = numcodecs.get_codec(CONFIG)
    enc = codec.encode(a)
    assert enc == codec.encode(a.copy())  # deterministic
    dec = codec.decode(enc)
    assert dec.shape == (a.shape[0], a.shape[1], int(np.prod(a.shape[2:])))
    np.testing.assert_array_equal(dec.reshape(a.shape), a)
    out = np.empty_like(a)  # into a caller's buffer, from a read-only view of the bytes
    codec.decode(np.frombuffer(enc, np.uint8), out=out)
    np.testing.assert_array_equal(out, a)


def test_pixel_major_layout_is_each_pixels_frames() -> None:
    """Byte [r, i, k] of the transposed window holds frames 8k..8k+7 of bit i of byte r (LSB =
    earliest)."""
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (2, 19, 6), dtype=np.uint8)
    bits = np.unpackbits(a, axis=-1, bitorder="little").reshape(2, 19, 6, 8)  # [n, T, byte, bit]
    padded = np.concatenate([bits, np.zeros((2, 5, 6, 8), np.uint8)], axis=1)  # T -> 24
    want = np.packbits(padded.reshape(2, 3, 8, 6, 8), axis=2, bitorder="little")[
        :, :, 0
    ]  # [n, K, byte, bit]
    np.testing.assert_array_equal(to_pixel_major(a), want.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(from_pixel_major(to_pixel_major(a), 19), a)
    w = rng.integers(0, 2**63, 50, dtype=np.uint64)
    np.testing.assert_array_equal(transpose8(transpose8(w.copy())), w)


def test_integrate_and_fire_windows_compress_well() -> None:
    """What the codec is for: the camera's periodic bits shrink to well under their size (zstd
    alone: ~0.9)."""
    a = np.stack([spike_window(h=32, w=64, seed=s) for s in range(4)])
    assert len(SpikeBits().encode(a)) < 0.7 * a.nbytes
    assert len(numcodecs.Zstd(level=5).encode(a)) > 0.8 * a.nbytes  # the same bits, time-major


def test_config_round_trips_and_bad_levels_are_refused() -> None:
    codec = numcodecs.get_codec({"id": CODEC_ID, "level": 3})
    assert codec.get_config() == {"id": CODEC_ID, "level": 3}
    assert numcodecs.get_codec(codec.get_config()) == codec
    for bad in (0, 23, "5", True):
        with pytest.raises(ValueError, match="level"):
            SpikeBits(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("damage", ["magic", "version", "truncate", "garbage", "short"])
def test_corrupt_stream_is_an_error_not_garbage(damage: str) -> None:
    enc = bytearray(SpikeBits().encode(np.stack([spike_window()])))
    if damage == "magic":
        enc[:4] = b"XXXX"
    elif damage == "version":
        enc[4] = 9
    elif damage == "truncate":
        enc = enc[: len(enc) // 2]
    elif damage == "garbage":
        enc[16:] = np.random.default_rng(0).bytes(len(enc) - 16)
    else:
        enc = enc[:10]
    with pytest.raises((ValueError, RuntimeError)):
        SpikeBits().decode(bytes(enc))


def test_field_spec_codec_json_and_layout() -> None:
    f = fmt.FieldSpec("spikes", "dense", "uint8", (40, 4, 2), codec=CONFIG)
    assert fmt.FieldSpec.from_json(json.loads(json.dumps(f.to_json()))) == f and hash(f)
    assert "codec" not in fmt.FieldSpec("x", "dense", "uint8").to_json()
    with pytest.raises(fmt.FormatError, match="dense"):
        fmt.FieldSpec("x", "csr", "float32", (5,), codec=CONFIG)


# -- builds
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo spike tree built with the spikebits default (pixel-major + zstd; zarr, tar), with
    the previous default (spikebits-v1: frame-major, this codec; zarr, tar) and with codec =
    "dataset" (zarr)."""
    root = tmp_path_factory.mktemp("spikebits")
    write_spike_demo(root / "data" / "demo")
    (root / "m").mkdir()
    text = (MANIFESTS / "demo_spike.toml").read_text()
    (root / "m" / "a.toml").write_text(text)
    (root / "m" / "b.toml").write_text(text.replace("[spike]", '[spike]\ncodec = "dataset"'))
    (root / "m" / "c.toml").write_text(text.replace("[spike]", '[spike]\ncodec = "spikebits-v1"'))
    outs = {}
    for name, manifest, enc in (
        ("zarr", "a", "zarr"),
        ("tar", "a", "tar"),
        ("plain", "b", "zarr"),
        ("v1-zarr", "c", "zarr"),
        ("v1-tar", "c", "tar"),
    ):
        build(root / "m" / f"{manifest}.toml", root / name, jobs=1, progress=False, encoding=enc)
        outs[name] = root / name
    return outs


def _batches(root: Path) -> list[dict[str, np.ndarray]]:
    ds = ShardDataset(
        root, split="train", sample="spike", batch_size=3, crop=(24, 40), num_bins=5, seed=2
    )
    return [{k: np.asarray(v) for k, v in b.items()} for b in ShardLoader(ds, num_workers=0)]


def test_index_declares_the_codec_and_its_version(builds: dict[str, Path]) -> None:
    for name in ("zarr", "tar"):
        index = fmt.read_index(builds[name])
        assert (
            index.field("spikes").codec == {"id": "zstd", "level": 5}
            and index.raw["version"] == fmt.INDEX_VERSION
        )
        assert (
            index.section()["codec"] == "spikebits"
            and index.section()["bit_order"] == "pixel_major"
        )
        index = fmt.read_index(builds[f"v1-{name}"])
        assert (
            index.field("spikes").codec == CONFIG and index.raw["version"] == fmt.INDEX_VERSION == 5
        )
        assert (
            index.section()["codec"] == "spikebits-v1"
            and index.section()["bit_order"] == "frame_major"
        )
    plain = fmt.read_index(builds["plain"])
    assert plain.field("spikes").codec is None and plain.raw["version"] == fmt.INDEX_VERSION == 5
    assert plain.section()["codec"] == "dataset"


def test_builds_with_and_without_the_codec_load_equal_batches(builds: dict[str, Path]) -> None:
    want = _batches(builds["plain"])
    assert want
    for name in ("zarr", "tar", "v1-zarr", "v1-tar"):
        got = _batches(builds[name])
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert sorted(g) == sorted(w)
            for k in w:
                np.testing.assert_array_equal(g[k], w[k], err_msg=f"{name}: {k}")


def test_codec_shards_are_smaller_and_hold_the_same_bits(builds: dict[str, Path]) -> None:
    plain = fmt.read_index(builds["plain"])
    for name in ("zarr", "tar", "v1-zarr", "v1-tar"):
        index = fmt.read_index(builds[name])
        for e, p in zip(index.shards, plain.shards, strict=True):
            got = read_shard(index.shard_path(e), index.encoding, ["spikes"])["spikes"]
            want = read_shard(plain.shard_path(p), "zarr", ["spikes"])["spikes"]
            if not name.startswith(
                "v1"
            ):  # pixel-major: the same bits, each pixel's frames together
                want = np.stack(
                    [
                        pack_pixel_major(np.unpackbits(w, axis=-1, bitorder="little")[..., :96])
                        for w in want
                    ]
                )
            np.testing.assert_array_equal(got, want)
    stored = {n: sum(s.bytes for s in fmt.read_index(builds[n]).shards) for n in ("zarr", "plain")}
    assert (
        stored["zarr"] < stored["plain"]
    )  # paired images (blosc-lz4 in both) dominate the demo's bytes


def _copy_with(src: Path, dst: Path, codec: object) -> Path:
    shutil.copytree(src, dst)
    doc = json.loads((dst / fmt.INDEX_FILE).read_text())
    for f in doc["fields"]:
        if f["name"] == "spikes":
            f["codec"] = codec
    (dst / fmt.INDEX_FILE).write_text(json.dumps(doc))
    return dst


@pytest.mark.parametrize(
    "codec, match",
    [
        ({"id": "shardsmith.spikebits9"}, "unknown to this shardsmith"),
        ({"id": CODEC_ID, "level": "high"}, "bad config"),
        ("spikebits", "must be an object"),
    ],
)
def test_unknown_codec_or_bad_config_is_a_clear_error(
    builds: dict[str, Path], tmp_path: Path, codec: object, match: str
) -> None:
    root = _copy_with(builds["zarr"], tmp_path / "d", codec)
    with pytest.raises(fmt.FormatError, match=match) as e:
        ShardDataset(root, split="train", sample="spike")
    assert "'spikes'" in str(e.value) and "index.json" in str(e.value)


def test_codec_in_an_old_index_version_and_newer_versions_are_refused(
    builds: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy_with(builds["zarr"], tmp_path / "d", CONFIG)
    doc = json.loads((root / fmt.INDEX_FILE).read_text())
    (root / fmt.INDEX_FILE).write_text(json.dumps({**doc, "version": 2}))
    with pytest.raises(fmt.FormatError, match="cannot"):
        fmt.read_index(root)
    (root / fmt.INDEX_FILE).write_text(json.dumps({**doc, "version": fmt.INDEX_VERSION + 1}))
    with pytest.raises(fmt.FormatError, match="upgrade shardsmith"):
        fmt.read_index(root)


@pytest.mark.parametrize("name", ["zarr", "tar", "v1-zarr", "v1-tar"])
def test_corrupt_codec_bytes_name_the_shard(
    builds: dict[str, Path], tmp_path: Path, name: str
) -> None:
    root = tmp_path / "d"
    shutil.copytree(builds[name], root)
    index = fmt.read_index(root)
    shard = index.shard_path(index.shards[0])
    if name.endswith("zarr"):
        chunk = next(
            p for p in (shard / "spikes").rglob("*") if p.is_file() and p.name != "zarr.json"
        )
        data = bytearray(chunk.read_bytes())
        data[40:] = np.random.default_rng(0).bytes(
            len(data) - 40
        )  # past the header: zstd sees garbage
        chunk.write_bytes(bytes(data))
    else:
        import tarfile

        with tarfile.open(shard) as tf:
            info = next(i for i in tf.getmembers() if i.name.endswith(".spikes.npy"))
        data = bytearray(shard.read_bytes())
        body = (
            info.offset_data + 128 + 16 + 40
        )  # .npy header, stream header, then into the zstd frame
        data[body : body + 64] = np.random.default_rng(0).bytes(64)
        shard.write_bytes(bytes(data))
    with pytest.raises(fmt.FormatError, match=str(shard)):
        read_shard(shard, index.encoding, ["spikes"])


def test_generator_noise_is_opt_in_and_does_what_it_says() -> None:
    """integrate_and_fire's noise options (the bench's noisy corpus): off by default, dark spikes at
    the asked rate where nothing fires, threshold jitter moves spikes but keeps the firing rate."""
    light = scene(np.arange(64), 32, 48, 3)
    clean = integrate_and_fire(light, seed=4)
    acc, want = np.random.default_rng(4).uniform(0, 1, light.shape[1:]).astype(np.float32), []
    for frame in light:  # the plain model, written out
        acc += 0.6 * frame
        want.append(acc >= 1)
        acc[want[-1]] -= 1
    np.testing.assert_array_equal(clean, np.array(want, np.uint8))
    dark = integrate_and_fire(np.zeros((200, 50, 50), np.float32), seed=1, dark=0.01)
    assert 0.008 < dark.mean() < 0.012
    jittered = integrate_and_fire(light, seed=4, jitter=0.05)
    assert (jittered != clean).mean() > 0.01 and abs(jittered.mean() - clean.mean()) < 0.01
