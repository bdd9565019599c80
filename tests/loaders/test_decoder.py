"""The decoder process: the same batches as decoding in-process, bad shards named, a dead child
never hangs."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import ShardDataset
from loaders.engine.decoder import AVAILABLE, Decoder, DecoderError
from loaders.engine.window import WindowReader
from loaders.format import FormatError
from loaders.samples.arena import BufferPool

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="the decoder process needs Linux memfd")
Helper = Callable[..., Any]  # a function from a fixture of tests/conftest.py or its plug-in


@pytest.fixture(scope="module")
def fx(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("dec"), "shards", n_shards=5, cells=90, genes=30, seed=7
    )


@pytest.mark.process
@pytest.mark.parametrize("sample", ["cells", "pairs", "sentences"])
def test_decoder_process_gives_the_in_process_batches(
    fx: Any, sample: str, started: Helper, batches: Helper, assert_same: Helper, check_cells: Helper
) -> None:
    kw = {
        "sample": sample,
        "batch_size": 7 if sample == "sentences" else 33,
        "window": 2,
        "seed": 3,
    }
    via = started(ShardDataset(fx.root, decode_process=True, **kw))  # type: ignore[arg-type]
    got = batches(via)
    want = batches(ShardDataset(fx.root, decode_process=False, **kw))  # type: ignore[arg-type]
    assert_same(got, want)
    if sample == "cells":
        truth = fx.truth
        for b in got:
            check_cells(b, truth)
    assert (
        via.engine_here().decoder_state is not None
        and len(via.engine_here().decoder_state._slabs) >= 1
    )


@pytest.mark.process
@pytest.mark.parametrize("encoding", ["zarr", "tar"])
def test_decoder_process_reads_every_encoding(
    built_zarr_tar: dict[str, Path],
    encoding: str,
    started: Helper,
    batches: Helper,
    assert_same: Helper,
) -> None:
    built = built_zarr_tar  # one manifest built as zarr and as tar
    got = batches(
        started(ShardDataset(built[encoding], batch_size=50, decode_process=True)), epochs=(0,)
    )
    want = batches(ShardDataset(built[encoding], batch_size=50, decode_process=False), epochs=(0,))
    assert_same(got, want)


@pytest.mark.process
def test_a_small_slab_is_replaced_by_a_big_enough_one(fx: Any) -> None:
    spec = {
        "root": str(fx.root),
        "split": "train",
        "sample": "cells",
        "window": 3,
        "seed": 0,
        "shuffle": True,
    }
    reader = WindowReader.from_spec(spec)
    dec = Decoder(spec)
    try:
        for epoch in range(4):
            arena = dec.read_window(
                epoch, 0, hint=1
            )  # far too small: the child says how much it needs
            here = reader.read_window(epoch, 0, BufferPool())
            for a in (arena, here):
                a.seal()
            got, want = arena.arrays(), here.arrays()
            assert got.keys() == want.keys()
            for name in want:  # X (indptr, indices, data), every other column, order, units, shards
                n = (
                    want[name].shape[0]
                    if name.startswith("col:") and not name.endswith("indptr")
                    else None
                )
                np.testing.assert_array_equal(got[name][:n], want[name][:n])
            arena.release(BufferPool())
        assert len(dec._free) <= dec.keep + 1 and len(dec._slabs) <= 2 * (dec.keep + 1)
    finally:
        dec.close()
    assert dec.proc.poll() is not None  # the child ended with close()


@pytest.mark.process
def test_broken_shard_through_the_decoder_names_the_file(
    fx: Any, tmp_path: Path, broken_copy: Helper, started: Helper, batches: Helper
) -> None:
    shard = broken_copy(fx, tmp_path / "ds", "corrupt")
    ds = started(ShardDataset(tmp_path / "ds", batch_size=64, window=1, decode_process=True))
    with pytest.raises(FormatError, match=re.escape(str(shard))):
        batches(ds, epochs=(0,))


@pytest.mark.process
def test_a_killed_decoder_is_reported_and_decoding_goes_on_here(
    fx: Any, started: Helper, batches: Helper, assert_same: Helper
) -> None:
    """A dead child never hangs the loader: a RuntimeWarning says so, and the epoch is still exact."""
    ds = started(
        ShardDataset(fx.root, batch_size=16, window=1, decode_process=True, decode_ahead=False)
    )
    dec = ds.engine_here().decoder()
    assert dec is not None
    os.kill(dec.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.warns(RuntimeWarning, match="decoder process .* exited"):
        got = batches(ds, epochs=(0,))
    assert time.monotonic() - t0 < 10 and not ds.decode_process
    assert_same(
        got,
        batches(ShardDataset(fx.root, batch_size=16, window=1, decode_process=False), epochs=(0,)),
    )
    with pytest.raises(DecoderError, match="after close"):
        dec.read_window(0, 0, 1)


@pytest.mark.process
def test_workers_forked_after_the_main_process_decoded_do_their_own(
    fx: Any, started: Helper, batches: Helper, assert_same: Helper
) -> None:
    """A forked worker inherits the dataset, decoder handle included: it must not talk to that
    child."""
    ds = started(ShardDataset(fx.root, batch_size=40, window=2, decode_process=True))
    main = batches(ds, epochs=(0,))
    forked = batches(ds, epochs=(0,), num_workers=2, multiprocessing_context="fork")
    key = lambda b: b["sample_id"][0].item()  # noqa: E731 - worker batches interleave: compare by content
    assert_same(sorted(main, key=key), sorted(forked, key=key))
    assert (
        ds.engine_here().decoder_state is not None
        and ds.engine_here().decoder_state.proc.poll() is None
    )  # still serving the parent


@pytest.mark.process
def test_a_one_window_split_decodes_here_and_never_starts_a_decoder_process(
    fx: Any, batches: Helper, assert_same: Helper
) -> None:
    """With the whole split in one window it is decoded once and served live to later epochs, so
    a decoder process (~0.45 CPU-s to start) would sit idle: none starts. With several windows
    an epoch one does (it decodes the next windows while one is served). Same batches."""
    kw: dict[str, Any] = {"batch_size": 33, "seed": 3}
    one = ShardDataset(fx.root, decode_process=True, window=64, **kw)
    several = ShardDataset(fx.root, decode_process=True, window=1, **kw)
    got = batches(one)
    assert one.engine_here().decoder_state is None
    assert_same(got, batches(ShardDataset(fx.root, decode_process=False, window=64, **kw)))
    assert len(got) > 0 and len(several.entries) > 1
    batches(several)
    assert several.engine_here().decoder_state is not None
