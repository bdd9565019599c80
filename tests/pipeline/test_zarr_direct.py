"""The zarr writer's direct path (pipeline.writers.zarr_direct) writes zarr-python's bytes: every
file of a shard equals what zarr-python writes for the same columns, for every codec, dtype,
shape and chunking; a signature it cannot vouch for goes through zarr-python; a whole build is
byte-identical either way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pipeline.writers.zarr_writer as zarr_writer
from loaders import format as fmt
from pipeline.build import build
from pipeline.writers import Codec, zarr_direct

CODECS = [Codec("blosc-lz4", 5), Codec("blosc-zstd", 3), Codec("zstd", 3), Codec("none", 0)]


class Lazy:
    """A column sliced by rows only, as the pack's ShardRows columns are."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.shape, self.dtype = a, a.shape, a.dtype

    def __getitem__(self, key: slice) -> np.ndarray:
        return self.a[key].copy()


def columns(rng: np.random.Generator) -> dict[str, Any]:
    return {
        "X/data": rng.random(3001).astype(np.float32),
        "X/indices": rng.integers(0, 2000, 3001).astype(np.int32),
        "X/indptr": np.arange(101, dtype=np.int64),
        "obs/batch": rng.integers(0, 5, 100).astype(np.int32),
        "primary": rng.random(100) > 0.5,
        "pairs": rng.integers(0, 100, (37, 2)).astype(np.int32),
        "sentences": rng.integers(0, 100, (9, 128)).astype(np.int32),
        "empty": np.zeros((0, 128), np.int32),
        "none": np.zeros(0, np.int64),
        "obs_names/bytes": rng.integers(0, 255, 777).astype(np.uint8),
        "f64": rng.random(50),
        "i16": np.arange(3, dtype=np.int16),
        "big_endian": np.arange(40, dtype=">i4"),
        "obsm/X_pca": rng.random((100, 7)).astype(np.float32),
        "lazy": Lazy(rng.random(1500).astype(np.float32)),
    }


def tree(path: Path) -> dict[str, bytes]:
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def zarr_python(path: Path, cols: dict[str, Any], codec: Codec) -> None:
    arrays = {k: zarr_writer._array_like(cols[k]) for k in sorted(cols)}
    zarr_writer._write_with_zarr(path, arrays, {}, zarr_writer.zarr_compressors(codec))


@pytest.mark.parametrize(
    "chunk_bytes", [1000, 8 << 20]
)  # many chunks with a padded edge; one chunk each
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_same_files_as_zarr_python(
    tmp_path: Path, codec: Codec, chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zarr_writer, "CHUNK_BYTES", chunk_bytes)
    cols = columns(np.random.default_rng(0))
    zarr_writer.ZarrShardWriter(codec).write(tmp_path / "direct", cols)
    zarr_python(tmp_path / "zarr", cols, codec)
    ours, theirs = tree(tmp_path / "direct"), tree(tmp_path / "zarr")
    assert sorted(ours) == sorted(theirs)
    assert [k for k in ours if ours[k] != theirs[k]] == []
    assert "X/data/c/2" in ours or chunk_bytes > 1000  # the small chunks did make several chunks
    compressors = zarr_writer.zarr_compressors(codec)
    assert (
        zarr_direct.array_template(np.dtype(np.float32), (), compressors) is not None
    )  # the fast path ran


def test_chunks_are_written_round_robin_over_the_arrays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunk i of every array, then chunk i + 1: columns sliced from one source (a shard's
    X/data and X/indices, gathered together) ask for the same rows one after the other, so a
    source that keeps its last slice gathers each range once. The files are zarr-python's."""
    monkeypatch.setattr(zarr_writer, "CHUNK_BYTES", 4000)  # 1,000 float32 / int32 rows a chunk
    asked: list[tuple[str, int]] = []

    class Logged(Lazy):
        def __init__(self, name: str, a: np.ndarray) -> None:
            super().__init__(a)
            self.name = name

        def __getitem__(self, key: slice) -> np.ndarray:
            asked.append((self.name, key.start))
            return super().__getitem__(key)

    rng = np.random.default_rng(2)
    data, indices = rng.random(2500).astype(np.float32), rng.integers(0, 99, 2500).astype(np.int32)
    cols = {"X/data": Logged("data", data), "X/indices": Logged("indices", indices)}
    zarr_writer.ZarrShardWriter(CODECS[0]).write(tmp_path / "direct", cols)
    assert asked == [(n, lo) for lo in (0, 1000, 2000) for n in ("data", "indices")]
    zarr_python(tmp_path / "zarr", {"X/data": data, "X/indices": indices}, CODECS[0])
    assert tree(tmp_path / "direct") == tree(tmp_path / "zarr")


def test_an_unverified_signature_goes_through_zarr_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A codec the direct path cannot encode, or a probe whose bytes differ, is written by
    zarr-python."""
    monkeypatch.setattr(zarr_direct, "_TEMPLATES", {})
    monkeypatch.setattr(
        zarr_direct, "ENCODERS", {}
    )  # no codec known: every compressed signature fails
    calls: list[list[str]] = []
    real = zarr_writer._write_with_zarr

    def spy(path: Path, arrays: dict[str, Any], *a: Any) -> None:
        calls.append(sorted(arrays))
        real(path, arrays, *a)

    monkeypatch.setattr(zarr_writer, "_write_with_zarr", spy)
    cols = columns(np.random.default_rng(1))
    zarr_writer.ZarrShardWriter(CODECS[0]).write(tmp_path / "a", cols)
    assert calls == [sorted(cols)]
    zarr_python(tmp_path / "b", cols, CODECS[0])
    assert tree(tmp_path / "a") == tree(tmp_path / "b")

    monkeypatch.setattr(zarr_direct, "_TEMPLATES", {})
    monkeypatch.setattr(zarr_direct, "ENCODERS", {"blosc": lambda conf: lambda b: b"not blosc"})
    assert (
        zarr_direct.array_template(np.dtype(np.int32), (), zarr_writer.zarr_compressors(CODECS[0]))
        is None
    )


def test_a_build_is_byte_identical_either_way(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    build_dataset(tmp_path, "sources", sources=2, cells=300)
    manifest = write_manifest(tmp_path / "m.toml")
    build(manifest, tmp_path / "direct", jobs=2, progress=False)
    with monkeypatch.context() as mp:
        mp.setattr(zarr_direct, "array_template", lambda *a: None)
        build(manifest, tmp_path / "zarr", jobs=2, progress=False)
    a, b = tmp_path / "direct", tmp_path / "zarr"
    assert fmt.index_path(a).read_bytes() == fmt.index_path(b).read_bytes()
    index = fmt.read_index(a)
    names = [e.file for e in index.shards]
    assert len(names) > 2 and index.conditions is not None
    for name in [f"{fmt.SHARDS_DIR}/{n}" for n in names] + [
        index.conditions.file
    ]:  # written on pack threads
        assert tree(a / name) == tree(b / name)  # and in the main thread (the condition table)
