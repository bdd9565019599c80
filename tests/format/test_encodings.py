"""One conformance suite for every shard encoding: a new encoding subclasses it and must pass
unchanged.

The logical contract (loaders.format) is what the loader sees, so each encoding must give back
exactly the columns it was given, byte-identical files for equal columns, and a FormatError
naming the file for anything missing or damaged.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import format as fmt
from loaders.format.readers import READERS, read_shard
from loaders.format.tar_reader import read_tar_shard
from loaders.format.validate import validate_columns
from pipeline.verify import verify
from pipeline.writers import Codec, get_writer
from pipeline.writers.tar_writer import BLOCK_RECORDS, TarShardWriter, TarStream

N_GENES = 50
VOXELS, COORDS, VALUES = "voxels", "coords", "values"  # a spike-like and a CT-like field
TABLES = (fmt.PAIRS, fmt.SENTENCES_PERT, fmt.SENTENCES_CTRL)
FIELDS = (
    fmt.FieldSpec(fmt.X, "csr", "float32", (N_GENES,)),
    fmt.FieldSpec(fmt.SAMPLE_ID, "dense", "int64"),
    fmt.FieldSpec(fmt.PRIMARY, "dense", "bool"),
    fmt.FieldSpec(fmt.COND_ID, "dense", "int32"),
    fmt.FieldSpec("obs/perturbation", "dense", "int32"),
    fmt.FieldSpec("obsm/X_pca", "dense", "float32", (5,)),
    fmt.FieldSpec(VOXELS, "dense", "uint8", (4, 8, 8)),
    fmt.FieldSpec(COORDS, "ragged", "uint16", (3,)),
    fmt.FieldSpec(VALUES, "ragged", "float32"),
)
KEYS = fmt.shard_keys(FIELDS, TABLES)
SPIKEBITS = {"id": "shardsmith.spikebits", "level": 5}  # a field codec (loaders.format.codecs)
BIG = 2 * BLOCK_RECORDS + 17  # three tar blocks, the last one partial


def _pointers(rng: np.random.Generator, n: int, hi: int) -> np.ndarray:
    lens = rng.integers(0, hi, n)
    lens[::7] = 0  # empty rows, some of them on block edges
    return np.r_[0, np.cumsum(lens)].astype(np.int64)


def make_columns(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Every field kind of the contract, with awkward cases: empty rows, multi-dim records, bool,
    tables."""
    rng = np.random.default_rng(seed)
    indptr, offsets = _pointers(rng, n, 6), _pointers(rng, n, 4)
    pairs = rng.integers(0, max(n, 1), (min(n, 9), 2)).astype(np.int32)
    sentences = rng.integers(0, max(n, 1), (min(n, 3), 4)).astype(np.int32)
    return {
        "X/indptr": indptr,
        "X/indices": rng.integers(0, N_GENES, indptr[-1]).astype(np.int32),
        "X/data": rng.random(indptr[-1], dtype=np.float32),
        fmt.SAMPLE_ID: rng.permutation(n).astype(np.int64),
        fmt.PRIMARY: rng.random(n) < 0.8,
        fmt.COND_ID: rng.integers(0, 4, n).astype(np.int32),
        "obs/perturbation": rng.integers(0, 9, n).astype(np.int32),
        "obsm/X_pca": rng.standard_normal((n, 5)).astype(np.float32),
        VOXELS: rng.integers(0, 256, (n, 4, 8, 8)).astype(np.uint8),
        "coords/offsets": offsets,
        "coords/values": rng.integers(0, 512, (offsets[-1], 3)).astype(np.uint16),
        "values/offsets": offsets.copy(),
        "values/values": rng.random(offsets[-1], dtype=np.float32),
        fmt.PAIRS: pairs,
        fmt.SENTENCES_PERT: sentences,
        fmt.SENTENCES_CTRL: sentences[:, ::-1].copy(),
    }


def assert_same_columns(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for k, a in want.items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape, (
            k,
            got[k].dtype,
            got[k].shape,
            a.dtype,
            a.shape,
        )
        np.testing.assert_array_equal(got[k], a, err_msg=k)


def shard_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


class ShardEncodingConformance:
    """Subclass with ``encoding = "<name>"``; pytest collects only the ``Test*`` subclasses."""

    encoding: str

    def write(self, folder: Path, columns: dict[str, np.ndarray], name: str = "shard") -> Path:
        writer = get_writer(self.encoding, Codec())
        path = folder / f"{name}{writer.suffix}"
        writer.write(path, columns, TABLES)
        return path

    @pytest.mark.parametrize("n", [0, 1, 100, BIG])
    def test_round_trip_every_kind(self, tmp_path: Path, n: int) -> None:
        cols = make_columns(n)
        got = read_shard(self.write(tmp_path, cols), self.encoding, KEYS)
        assert_same_columns(got, cols)
        assert validate_columns(got, FIELDS) == n

    def test_subset_of_keys(self, tmp_path: Path) -> None:
        cols = make_columns(BIG)
        keys = ["X/indptr", "coords/values", VOXELS, fmt.PAIRS]
        assert_same_columns(
            read_shard(self.write(tmp_path, cols), self.encoding, keys), {k: cols[k] for k in keys}
        )

    def test_same_columns_same_bytes(self, tmp_path: Path) -> None:
        a = self.write(tmp_path / "a", make_columns(BIG))
        b = self.write(tmp_path / "b", make_columns(BIG))
        assert fmt.content_hash(a) == fmt.content_hash(b)
        fa, fb = shard_files(a), shard_files(b)
        assert [p.relative_to(a) for p in fa] == [p.relative_to(b) for p in fb]
        assert all(x.read_bytes() == y.read_bytes() for x, y in zip(fa, fb, strict=True))
        c = self.write(tmp_path / "c", make_columns(BIG, seed=1))
        assert fmt.content_hash(c) != fmt.content_hash(a)

    def test_missing_shard_is_named(self, tmp_path: Path) -> None:
        path = tmp_path / f"gone{get_writer(self.encoding, Codec()).suffix}"
        for read in (
            lambda: read_shard(path, self.encoding, KEYS),
            lambda: READERS[self.encoding](path, KEYS),
        ):
            with pytest.raises(fmt.FormatError, match="gone"):
                read()

    def test_missing_column_is_named(self, tmp_path: Path) -> None:
        path = self.write(tmp_path, make_columns(10))
        with pytest.raises(fmt.FormatError) as e:
            read_shard(path, self.encoding, [*KEYS, "obs/nope"])
        assert str(path) in str(e.value) and "obs/nope" in str(e.value)

    def test_field_codec_round_trips_deterministically(self, tmp_path: Path) -> None:
        """A field's own codec (loaders.format.codecs) is stored by every encoding and read back
        exactly."""
        cols, writer = make_columns(BIG), get_writer(self.encoding, Codec())
        paths = [tmp_path / f"{name}{writer.suffix}" for name in ("a", "b")]
        for p in paths:
            writer.write(p, cols, TABLES, {VOXELS: SPIKEBITS})
        assert_same_columns(read_shard(paths[0], self.encoding, KEYS), cols)
        assert fmt.content_hash(paths[0]) == fmt.content_hash(paths[1])
        assert fmt.content_hash(self.write(tmp_path, cols)) != fmt.content_hash(
            paths[0]
        )  # the codec applied

    @pytest.mark.parametrize("damage", ["truncate", "garbage"])
    def test_corrupt_shard_is_named(self, tmp_path: Path, damage: str) -> None:
        path = self.write(tmp_path, make_columns(BIG))
        rng = np.random.default_rng(0)
        for p in shard_files(path):
            data = p.read_bytes()
            p.write_bytes(data[: len(data) // 2] if damage == "truncate" else rng.bytes(len(data)))
        with pytest.raises(fmt.FormatError) as e:
            read_shard(path, self.encoding, KEYS)
        assert str(path) in str(e.value)


class SlicedOnly:
    """A lazy column (shape, dtype, contiguous row slices) that refuses to be materialised whole and
    records the length of every slice asked of it."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.shape, self.dtype, self.ndim = a, a.shape, a.dtype, a.ndim
        self.sizes: list[int] = []

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice) -> np.ndarray:
        out = self.a[key].copy()
        self.sizes.append(out.shape[0])
        return out

    def __array__(self, *args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("a lazy column was materialised whole")


class TestZarr(ShardEncodingConformance):
    encoding = "zarr"


class TestTar(ShardEncodingConformance):
    encoding = "tar"

    def test_small_blocks(self, tmp_path: Path) -> None:
        cols = make_columns(50)
        path = tmp_path / "s.tar"
        TarShardWriter(Codec(), block_records=7).write(path, cols, TABLES)
        assert_same_columns(read_shard(path, "tar", KEYS), cols)

    def test_members_are_plain_sorted_and_deterministic(self, tmp_path: Path) -> None:
        path = self.write(tmp_path, make_columns(BIG))
        with tarfile.open(path) as tf:
            infos = tf.getmembers()
            meta = json.loads(tf.extractfile(infos[0]).read())
        names = [i.name for i in infos]
        assert (
            names == sorted(names) and names[0] == "_meta.json" and names[-1].startswith("tables.")
        )
        assert all(n.endswith(".npy") for n in names[1:]) and "b000000.x_indptr.npy" in names
        assert all(
            (i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) == (0, 0, 0, "", "", 0o644)
            for i in infos
        )
        assert (
            meta["n_records"] == BIG
            and meta["blocks"] == 3
            and meta["columns"]["x_indptr"] == "X/indptr"
        )
        assert sorted(meta["columns"].values()) == sorted(KEYS)

    def test_stock_webdataset_reads_it(self, tmp_path: Path) -> None:
        import webdataset as wds

        cols = make_columns(BIG)
        path = self.write(tmp_path, cols)
        samples = list(wds.WebDataset(str(path), shardshuffle=False).decode())
        assert [s["__key__"] for s in samples] == [
            "_meta",
            "b000000",
            "b000001",
            "b000002",
            "tables",
        ]
        meta = samples[0]["json"]
        fields = {f"{name}.npy": key for name, key in meta["columns"].items()}
        blocks = samples[1:-1]
        for s in samples[1:]:
            assert all(isinstance(v, np.ndarray) for k, v in s.items() if not k.startswith("__"))
        np.testing.assert_array_equal(
            np.concatenate([b["voxels.npy"] for b in blocks]), cols[VOXELS]
        )
        np.testing.assert_array_equal(
            np.concatenate([b["x_data.npy"] for b in blocks]), cols["X/data"]
        )
        assert [len(b["x_indptr.npy"]) - 1 for b in blocks] == [BLOCK_RECORDS, BLOCK_RECORDS, 17]
        assert all(b["x_indptr.npy"][0] == 0 for b in blocks)
        assert {fields[k] for k in samples[-1] if not k.startswith("__")} == set(TABLES)

    def test_field_codec_members_decode_with_numcodecs(self, tmp_path: Path) -> None:
        """Without shardsmith's reader: _meta.json names the codec, dtype and shape of a codec
        column."""
        import numcodecs
        import webdataset as wds

        import loaders.modalities.spike.bits  # noqa: F401  (registers the codec with numcodecs)

        cols, path = make_columns(BIG), tmp_path / "s.tar"
        TarShardWriter(Codec()).write(path, cols, TABLES, {VOXELS: SPIKEBITS})
        samples = list(wds.WebDataset(str(path), shardshuffle=False).decode())
        spec = samples[0]["json"]["codecs"][VOXELS]
        codec = numcodecs.get_codec(spec["codec"])
        got = [
            codec.decode(b["voxels.npy"]).reshape(-1, *spec["shape"]).view(spec["dtype"])
            for b in samples[1:-1]
        ]
        np.testing.assert_array_equal(np.concatenate(got), cols[VOXELS])

    def test_checked_bytes_are_viewed_not_copied(self, tmp_path: Path) -> None:
        """Given the file's bytes (read and checked by loaders.format.integrity), a member is a view of
        them: one copy fewer per shard than reading each member again. A cut buffer is still a
        FormatError naming the shard."""
        cols = make_columns(50)
        path = self.write(tmp_path, cols)
        data = path.read_bytes()
        got = read_tar_shard(path, KEYS, data)
        assert_same_columns(got, cols)
        whole = np.frombuffer(data, np.uint8)
        assert np.shares_memory(got[fmt.PAIRS], whole) and np.shares_memory(got[VOXELS], whole)
        with pytest.raises(fmt.FormatError, match=str(path)):
            read_tar_shard(path, KEYS, data[: len(data) // 2])

    def test_stream_writes_what_tarfile_writes(self, tmp_path: Path) -> None:
        """TarStream frames members as the stdlib does (pax headers for long or non-ASCII names,
        512-byte padding, end blocks and record padding): byte for byte."""
        members = [
            ("_meta.json", b"{}"),
            ("b000000.empty.npy", b""),
            ("b000000.exact.npy", bytes(range(256)) * 4),  # 1,024 bytes: no padding
            ("b000000." + "long_" * 30 + ".npy", b"x" * 1000),  # > 100 chars: a pax header
            ("tables.caf\u00e9.npy", b"y" * 513),
        ]
        ours, stdlib = tmp_path / "ours.tar", tmp_path / "stdlib.tar"
        with TarStream(ours) as tar:
            for name, data in members:
                tar.add(name, [data[:7], np.frombuffer(data[7:], np.uint8)])
        with tarfile.open(stdlib, mode="x:", format=tarfile.PAX_FORMAT) as tf:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tf.addfile(info, io.BytesIO(data))
        assert ours.read_bytes() == stdlib.read_bytes()
        with pytest.raises(FileExistsError):  # created exclusively, as tarfile's mode "x"
            TarStream(ours).__enter__()

    def test_lazy_columns_are_sliced_a_block_at_a_time(self, tmp_path: Path) -> None:
        """A spilled shard's columns are never materialised whole: the writer asks for one block's
        entries at a time, and the shard equals the one written from plain arrays."""
        cols = make_columns(BIG)
        lazy = {k: SlicedOnly(v) for k, v in cols.items() if k in ("X/data", "X/indices", VOXELS)}
        path, plain = tmp_path / "lazy.tar", tmp_path / "plain.tar"
        TarShardWriter(Codec()).write(path, {**cols, **lazy}, TABLES)
        TarShardWriter(Codec()).write(plain, cols, TABLES)
        assert path.read_bytes() == plain.read_bytes()
        ptr = cols["X/indptr"]
        most = max(ptr[min(b + BLOCK_RECORDS, BIG)] - ptr[b] for b in range(0, BIG, BLOCK_RECORDS))
        assert max(lazy["X/data"].sizes) == most and max(lazy[VOXELS].sizes) == BLOCK_RECORDS

    def _rewrite(
        self, path: Path, edit: dict[str, bytes | None], extra: tuple[str, bytes] | None = None
    ) -> None:
        """Rebuild the tar with some members replaced (bytes) or dropped (None), keeping headers
        valid."""
        with tarfile.open(path) as tf:
            members = [(i, tf.extractfile(i).read()) for i in tf.getmembers()]
        with tarfile.open(path, "w") as tf:
            for info, data in members + ([(tarfile.TarInfo(extra[0]), extra[1])] if extra else []):
                data = edit.get(info.name, data)
                if data is not None:
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))

    def test_dropped_block_member_is_truncation(self, tmp_path: Path) -> None:
        path = self.write(tmp_path, make_columns(BIG))
        self._rewrite(path, {"b000001.x_data.npy": None})
        with pytest.raises(fmt.FormatError, match="truncated"):
            read_shard(path, "tar", KEYS)

    def test_bad_header_mid_file_is_not_silent(self, tmp_path: Path) -> None:
        """tarfile ends the archive quietly at an invalid header after the first: the block count
        catches it."""
        path = self.write(tmp_path, make_columns(BIG))
        with tarfile.open(path) as tf:
            offset = next(i.offset for i in tf.getmembers() if i.name.startswith("b000001."))
        data = bytearray(path.read_bytes())
        data[offset + 148 : offset + 156] = b"9999999\0"  # header checksum
        path.write_bytes(bytes(data))
        with pytest.raises(fmt.FormatError, match=str(path)):
            read_shard(path, "tar", KEYS)

    @pytest.mark.parametrize("payload", [b"not an npy file", b"PK\x03\x04zip", None])
    def test_member_that_is_not_npy(self, tmp_path: Path, payload: bytes | None) -> None:
        path = self.write(tmp_path, make_columns(10))
        if payload is None:  # an object array, i.e. a pickle inside an .npy
            buf = io.BytesIO()
            np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
            payload = buf.getvalue()
        self._rewrite(path, {"b000000.sample_id.npy": payload})
        with pytest.raises(fmt.FormatError, match="not a valid .npy"):
            read_shard(path, "tar", KEYS)

    @pytest.mark.parametrize(
        "name",
        [
            "b000000.evil.pickle",
            "b000000.sample_id.npy",
            "b000000.pairs.npy",
            "tables.sample_id.npy",
            "zzz.sample_id.npy",
        ],
    )
    def test_foreign_duplicate_or_misplaced_member_is_refused(
        self, tmp_path: Path, name: str
    ) -> None:
        path = self.write(tmp_path, make_columns(10))
        buf = io.BytesIO()
        np.save(buf, np.zeros(10, np.int64))
        self._rewrite(path, {}, extra=(name, buf.getvalue()))
        with pytest.raises(fmt.FormatError, match="unexpected"):
            read_shard(path, "tar", KEYS)


# -- end to end: the same manifest built as zarr and as tar gives the same logical dataset
# ---------------
# (built_zarr_tar, tests/conftest.py: format -> one small manifest built in that format)
@pytest.mark.parametrize("encoding", ["zarr", "tar"])
def test_build_verifies(built_zarr_tar: dict[str, Path], encoding: str) -> None:
    out = built_zarr_tar[encoding]
    assert verify(out) == []
    index = fmt.read_index(out)
    suffix = get_writer(encoding, Codec()).suffix
    assert index.encoding == encoding and all(e.file.endswith(suffix) for e in index.shards)


def test_tar_and_zarr_builds_hold_the_same_columns(
    built_zarr_tar: dict[str, Path], read_all: Callable[..., Any]
) -> None:
    built = built_zarr_tar
    zi, zarr_shards = read_all(built["zarr"])
    ti, tar_shards = read_all(built["tar"])
    assert len(zarr_shards) == len(tar_shards) > 2
    assert zi.vocabularies == ti.vocabularies and zi.fields == ti.fields
    for (ze, zc), (te, tc) in zip(zarr_shards, tar_shards, strict=True):
        assert (ze.split, ze.records, dict(ze.units)) == (te.split, te.records, dict(te.units))
        assert_same_columns(tc, zc)
    vectors = [
        read_shard(i.root / i.conditions.file, i.encoding, ["vectors"])["vectors"] for i in (zi, ti)
    ]
    np.testing.assert_array_equal(*vectors)
