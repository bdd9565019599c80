"""Fewer bytes through fresh page-cache pages, the same shards: column indices spill as uint16
where every valid index fits (at most 65,536 columns), planned integer columns whose values fit
16 bits are parked as uint16, and both come back widened into reused buffers
(docs/PIPELINE.md, "Memory")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from loaders import format as fmt
from pipeline import parking
from pipeline.buffers import Scratch
from pipeline.build import build
from pipeline.errors import SourceError
from pipeline.manifest import SourceSpec
from pipeline.modalities.perturbation import pack
from pipeline.planned import NARROWED, load_column, park_column, release_columns


def _shards(out: Path) -> list[tuple[str, str]]:
    return [(e.file, e.digest) for e in fmt.read_index(out).shards]


def test_narrow_and_wide_spills_make_the_same_shards(
    split_source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    count_calls: Callable[..., list[int]],
) -> None:
    monkeypatch.setattr(parking, "PARK_BYTES", 0)  # spill files, never the memory park
    narrowed = count_calls(pack, "narrowed")
    build(split_source, tmp_path / "narrow", jobs=2, progress=False)
    assert narrowed[0] > 0  # the spill really went through uint16
    monkeypatch.setattr(pack, "NARROW_LIMIT", 0)  # no matrix fits: int32 spill files, as before
    narrowed[0] = 0
    build(split_source, tmp_path / "wide", jobs=2, progress=False)
    assert narrowed[0] == 0
    assert _shards(tmp_path / "narrow") == _shards(tmp_path / "wide")
    assert len(_shards(tmp_path / "wide")) > 2


def test_an_index_past_16_bits_stops_the_build_instead_of_wrapping(tmp_path: Path) -> None:
    spec = SourceSpec(path=tmp_path / "k562.h5ad", type="h5ad")
    idx = np.array([0, 7, 65535], np.int32)
    out = pack.narrowed(idx, np.array([0, 65535]), Scratch(), spec)
    assert out.dtype == np.uint16 and out.tolist() == [0, 7, 65535]
    for bad in ([0, 65536], [-1, 10]):
        with pytest.raises(SourceError, match="k562.h5ad.*do not fit"):
            pack.narrowed(idx, np.array(bad), Scratch(), spec)


@pytest.mark.parametrize(
    ("values", "narrow"),
    [
        (np.arange(40_000, dtype=np.int32).reshape(-1, 8), True),  # sentences: (n, size)
        (np.array([0, 65535, 3], np.int64), True),
        (np.array([0, 65536], np.int32), False),
        (np.array([-1, 5], np.int32), False),
        (np.array([1, 2], np.uint16), False),  # already 16 bits
        (np.linspace(0, 1, 50, dtype=np.float32), False),
        (np.zeros(0, np.int32), False),
    ],
)
def test_parked_columns_come_back_equal(values: np.ndarray, narrow: bool, tmp_path: Path) -> None:
    path = park_column(tmp_path / "plan-0-train-0-sentences~pert", values)
    assert path.name.endswith(NARROWED) == narrow
    scratch = Scratch()
    got = load_column(path, "sentences/pert", scratch)
    assert got.dtype == values.dtype and got.shape == values.shape
    np.testing.assert_array_equal(got, values)


def test_a_column_of_the_next_shard_reuses_its_buffer(tmp_path: Path) -> None:
    scratch = Scratch()
    a = park_column(tmp_path / "plan-0-train-0-pairs", np.arange(300_000, dtype=np.int32) % 999)
    b = park_column(tmp_path / "plan-0-train-1-pairs", np.arange(200_000, dtype=np.int32) % 7)
    first = load_column(a, "pairs", scratch)
    base = first.base if first.base is not None else first
    second = load_column(b, "pairs", scratch)
    assert np.shares_memory(second, base)  # no fresh pages for the next shard
    np.testing.assert_array_equal(second, np.arange(200_000, dtype=np.int32) % 7)
    release_columns(scratch)
    assert not [n for n in scratch.buffers if n.startswith("parked-")]


def test_columns_of_one_shard_never_share_a_buffer(tmp_path: Path) -> None:
    """Names alike up to a dot (covariates "t.a" and "t.b") are still two columns, held at once
    while their shard is written."""
    scratch = Scratch()
    want = {
        "obs/t.a": np.arange(5000, dtype=np.int32),
        "obs/t.b": np.arange(5000, dtype=np.int32)[::-1].copy(),
    }
    paths = {
        k: park_column(tmp_path / f"plan-0-train-0-{k.replace('/', '~')}", v)
        for k, v in want.items()
    }
    got = {k: load_column(p, k, scratch) for k, p in paths.items()}
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_a_cut_parked_column_is_an_error(tmp_path: Path) -> None:
    path = park_column(tmp_path / "plan-0-train-0-pairs", np.arange(5000, dtype=np.int32))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(RuntimeError, match="shorter than its header says"):
        load_column(path, "pairs", Scratch())
