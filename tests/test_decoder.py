"""The decoder process: the same batches as decoding in-process, bad shards named, a dead child never hangs."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from loaders import ShardDataset, ShardLoader
from loaders.engine.arena import BufferPool
from loaders.engine.decoder import AVAILABLE, Decoder, DecoderError
from loaders.format import FormatError
from loaders.engine.window import WindowReader
from tests.shard_fixtures import Fixture, make_dataset
from tests.test_encodings import built  # noqa: F401 - the module fixture: one manifest built as zarr and as tar
from tests.test_loader import TIMEOUT, Truth, _broken_copy, check_cells

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="the decoder process needs Linux memfd")


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Fixture:
    return make_dataset(tmp_path_factory.mktemp("dec"), n_shards=5, cells_per_shard=90, n_genes=30, seed=7)


def started(ds: ShardDataset) -> ShardDataset:
    """Wait until the dataset's decoder process is up, so that every window goes through it."""
    dec = ds._decoder()
    assert dec is not None
    deadline = time.monotonic() + TIMEOUT
    while not dec.ready():
        assert time.monotonic() < deadline, "decoder process did not start"
        time.sleep(0.01)
    return ds


def batches(ds: ShardDataset, epochs: tuple[int, ...] = (0, 1), **kw: object) -> list[dict[str, torch.Tensor]]:
    dl = ShardLoader(ds, timeout=TIMEOUT, **kw)  # type: ignore[arg-type]
    out = []
    for e in epochs:
        dl.set_epoch(e)
        out += list(dl)
    return out


def assert_same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k].numpy(), y[k].numpy(), err_msg=k)


@pytest.mark.parametrize("sample", ["cells", "pairs", "sentences"])
def test_decoder_process_gives_the_in_process_batches(fx: Fixture, sample: str) -> None:
    kw = {"sample": sample, "batch_size": 7 if sample == "sentences" else 33, "window": 2, "seed": 3}
    via = started(ShardDataset(fx.root, decode_process=True, **kw))  # type: ignore[arg-type]
    got = batches(via)
    want = batches(ShardDataset(fx.root, decode_process=False, **kw))  # type: ignore[arg-type]
    assert_same(got, want)
    if sample == "cells":
        truth = Truth(fx)
        for b in got:
            check_cells(b, truth)
    assert via._decoder_state is not None and len(via._decoder_state[1]._slabs) >= 1


@pytest.mark.parametrize("encoding", ["zarr", "tar"])
def test_decoder_process_reads_every_encoding(built: dict[str, Path], encoding: str) -> None:  # noqa: F811
    got = batches(started(ShardDataset(built[encoding], batch_size=50, decode_process=True)), epochs=(0,))
    want = batches(ShardDataset(built[encoding], batch_size=50, decode_process=False), epochs=(0,))
    assert_same(got, want)


def test_a_small_slab_is_replaced_by_a_big_enough_one(fx: Fixture) -> None:
    spec = {"root": str(fx.root), "split": "train", "sample": "cells", "window": 3, "seed": 0, "shuffle": True}
    reader = WindowReader.from_spec(spec)
    dec = Decoder(spec)
    try:
        for epoch in range(4):
            arena = dec.read_window(epoch, 0, hint=1)  # far too small: the child says how much it needs
            here = reader.read_window(epoch, 0, BufferPool())
            for a in (arena, here):
                a.seal()
            got, want = arena.arrays(), here.arrays()
            assert got.keys() == want.keys()
            for name in want:  # X (indptr, indices, data), every other column, order, units, shards
                n = want[name].shape[0] if name.startswith("col:") and not name.endswith("indptr") else None
                np.testing.assert_array_equal(got[name][:n], want[name][:n])
            arena.release(BufferPool())
        assert len(dec._free) <= dec.keep + 1 and len(dec._slabs) <= 2 * (dec.keep + 1)
    finally:
        dec.close()
    assert dec.proc.poll() is not None  # the child ended with close()


def test_broken_shard_through_the_decoder_names_the_file(fx: Fixture, tmp_path: Path) -> None:
    shard = _broken_copy(fx, tmp_path / "ds", "corrupt")
    ds = started(ShardDataset(tmp_path / "ds", batch_size=64, window=1, decode_process=True))
    with pytest.raises(FormatError, match=re.escape(str(shard))):
        batches(ds, epochs=(0,))


def test_a_killed_decoder_is_reported_and_decoding_goes_on_here(fx: Fixture) -> None:
    """A dead child never hangs the loader: a RuntimeWarning says so, and the epoch is still exact."""
    ds = started(ShardDataset(fx.root, batch_size=16, window=1, decode_process=True, decode_ahead=False))
    dec = ds._decoder()
    assert dec is not None
    os.kill(dec.proc.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.warns(RuntimeWarning, match="decoder process .* exited"):
        got = batches(ds, epochs=(0,))
    assert time.monotonic() - t0 < 10 and not ds.decode_process
    assert_same(got, batches(ShardDataset(fx.root, batch_size=16, window=1, decode_process=False), epochs=(0,)))
    with pytest.raises(DecoderError, match="after close"):
        dec.read_window(0, 0, 1)


def test_workers_forked_after_the_main_process_decoded_do_their_own(fx: Fixture) -> None:
    """A forked worker inherits the dataset, decoder handle included: it must not talk to that child."""
    ds = started(ShardDataset(fx.root, batch_size=40, window=2, decode_process=True))
    main = batches(ds, epochs=(0,))
    forked = batches(ds, epochs=(0,), num_workers=2, multiprocessing_context="fork")
    key = lambda b: b["sample_id"][0].item()  # noqa: E731 - worker batches interleave: compare by content
    assert_same(sorted(main, key=key), sorted(forked, key=key))
    assert ds._decoder_state is not None and ds._decoder_state[1].proc.poll() is None  # still serving the parent
