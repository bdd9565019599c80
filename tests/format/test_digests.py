"""Named content digests (index version 4, xxh3-128): new builds write them, datasets written with
sha256 (index versions 1-3) still verify, inspect and load, and a changed byte is caught through
either algorithm.

``tests/data/sha256-index/{zarr,tar}`` is a dataset committed as shardsmith wrote it before
version 4 (one 60-cell source, sha256 digests, index version 2): it is never rebuilt, so these
tests keep holding the reader to what older builds wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from loaders import format as fmt
from loaders.format.digests import (
    DIGESTS,
    READ_BLOCK,
    algorithm,
    as_stored_before,
    bytes_digest,
    feed_file,
    feed_mapped,
    hasher,
    tagged,
)
from loaders.format.files import content_hash, shard_digest_matches
from pipeline.cli import main
from pipeline.verify import verify
from tests import hostile

OLD = Path(__file__).resolve().parents[1] / "data" / "sha256-index"


@pytest.fixture(params=["zarr", "tar"])
def old(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A copy of the committed sha256 dataset of one encoding (tests may damage it)."""
    return Path(shutil.copytree(OLD / request.param, tmp_path / request.param))


def _flip_last_byte(path: Path) -> None:
    """One byte of the shard's largest file changed: the same size, other content."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    target = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))


def _sample_ids(root: Path, **kw: object) -> np.ndarray:
    """Every split's cells, as the loader serves them."""
    got = []
    for split in sorted({e.split for e in fmt.read_index(root).shards}):
        opts = dict(split=split, batch_size=16, window=2, decode_process=False, **kw)
        ds = ShardDataset(root, **opts)  # type: ignore[arg-type]
        got += [b["sample_id"].numpy() for b in ShardLoader(ds)]
    return np.concatenate(got)


def test_the_old_fixture_is_what_version_3_and_older_wrote() -> None:
    raw = json.loads((OLD / "zarr" / "index.json").read_text())
    assert raw["version"] == 2 and all(len(s["sha256"]) == 64 for s in raw["shards"])
    assert "digest" not in raw["shards"][0] and "sha256" in raw["sources"][0]


@hostile.parametrize
def test_an_old_sha256_dataset_verifies_inspects_and_loads(case: hostile.Case, old: Path) -> None:
    index = fmt.read_index(old)
    assert {algorithm(e.digest) for e in index.shards} == {"sha256"}
    assert algorithm(index.conditions.digest) == "sha256"  # type: ignore[union-attr]
    assert verify(old) == []
    assert main(["inspect", str(old)]) == 0
    got = _sample_ids(old, verify="always")
    assert got.size == index.primary_records and np.unique(got).size == got.size
    assert all(shard_digest_matches(e, index.shard_path(e)) for e in index.shards)


@hostile.parametrize
def test_a_changed_byte_of_an_old_dataset_is_caught(case: hostile.Case, old: Path) -> None:
    index = fmt.read_index(old)
    entry = max(index.shards, key=lambda e: e.records)
    _flip_last_byte(index.shard_path(entry))
    assert not shard_digest_matches(entry, index.shard_path(entry))
    assert any("content hash mismatch" in p for p in verify(old))
    with pytest.raises(fmt.FormatError, match="content hash mismatch"):
        _sample_ids(old, verify="always")


def test_a_new_build_names_xxh3_and_catches_a_changed_byte(
    built_zarr_tar: dict[str, Path], tmp_path: Path
) -> None:
    for encoding, built in built_zarr_tar.items():
        root = Path(shutil.copytree(built, tmp_path / encoding))
        raw = json.loads(fmt.index_path(root).read_text())
        assert raw["version"] == fmt.INDEX_VERSION == 5
        assert all("sha256" not in s for s in [*raw["shards"], *raw["sources"]])
        digests = [s["digest"] for s in raw["shards"]] + [raw["conditions"]["digest"]]
        digests += [s["digest"] for s in raw["sources"]]
        assert {algorithm(d) for d in digests} == {"xxh3_128"}
        index = fmt.read_index(root)
        entry = max(index.shards, key=lambda e: e.records)
        assert content_hash(index.shard_path(entry)) == entry.digest
        assert shard_digest_matches(entry.digest, index.shard_path(entry))
        _flip_last_byte(index.shard_path(entry))
        assert not shard_digest_matches(entry, index.shard_path(entry))
        assert not shard_digest_matches(entry, root / "shards" / "gone.zarr")
        assert any("content hash mismatch" in p for p in verify(root))
        with pytest.raises(fmt.FormatError, match="content hash mismatch"):
            _sample_ids(root, verify="always")


def test_an_unknown_algorithm_is_a_format_error_naming_the_known(
    built_zarr_tar: dict[str, Path],
) -> None:
    index = fmt.read_index(built_zarr_tar["tar"])
    entry = index.shards[0]
    with pytest.raises(fmt.FormatError, match=r"unknown digest algorithm 'blake9'.*sha256"):
        content_hash(index.shard_path(entry), "blake9")
    assert not shard_digest_matches("blake9:00", index.shard_path(entry))


def test_names_and_legacy_forms() -> None:
    assert set(DIGESTS.names()) >= {"sha256", "xxh3_128"}
    sha = bytes_digest(b"x", "sha256")
    assert tagged(sha.split(":")[1]) == sha and algorithm(sha.split(":")[1]) == "sha256"
    assert as_stored_before(sha) == sha.split(":")[1]  # resume states saved on old datasets
    xxh = bytes_digest(b"x")
    assert algorithm(xxh) == "xxh3_128" and len(xxh) == len("xxh3_128:") + 32
    assert as_stored_before(xxh) == xxh and tagged("") == ""


@pytest.mark.parametrize("name", ["xxh3_128", "sha256"])
def test_file_reads_and_mapped_windows_hash_the_same_bytes(name: str, tmp_path: Path) -> None:
    """The build hashes its own shards through mapped windows (feed_mapped), everything else by
    reads into a reused buffer (feed_file): one digest of the same bytes, at every edge of a
    block, for a file and for a folder."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "shard"
    folder.mkdir()
    sizes = [0, 1, READ_BLOCK - 1, READ_BLOCK, READ_BLOCK + 1, 2 * READ_BLOCK + 17]
    for i, n in enumerate(sizes):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        path = folder / f"f{i}"
        path.write_bytes(data)
        want = hasher(name)
        want.update(data)
        for feed in (feed_file, feed_mapped):
            h = hasher(name)
            assert feed(h, path) == n
            assert h.hexdigest() == want.hexdigest(), (feed.__name__, n)
    assert content_hash(folder, name, feed=feed_mapped) == content_hash(folder, name)
    assert content_hash(folder / "f5", name, feed=feed_mapped) == content_hash(folder / "f5", name)


def test_a_file_system_that_cannot_map_files_is_read_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some mounts (FUSE) refuse mmap: the build's shard digest then reads the file, same digest."""
    import mmap  # the module whose constructor this test replaces

    path = tmp_path / "f"
    path.write_bytes(np.arange(3 * READ_BLOCK // 8, dtype=np.int64).tobytes())
    want = content_hash(path)

    def refuse(*_a: object, **_k: object) -> None:
        raise OSError(19, "No such device")

    monkeypatch.setattr(mmap, "mmap", refuse)
    assert content_hash(path, feed=feed_mapped) == want
