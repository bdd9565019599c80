"""The device path (staging, side stream, finish on the device, hand-over) run on the CPU: the same
functions as on CUDA minus the CUDA calls (loaders.engine.device.Backend), batches equal to the host
path's exactly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from loaders import ShardDataset, ShardLoader, device
from loaders.modalities.perturbation.ops import SCATTER_OP

TIMEOUT = 60  # seconds a worker may take for a batch: a hang fails the test instead of blocking it


@pytest.fixture(scope="module")
def fx(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("devcpu"), "shards", n_shards=4, cells=70, genes=33, seed=5
    )


def epoch(dl: ShardLoader) -> list[dict[str, torch.Tensor]]:
    dl.set_epoch(1)
    return list(dl)


@pytest.mark.parametrize("sample", ["cells", "pairs", "sentences"])
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.process)])
def test_device_cpu_runs_the_device_path_and_equals_the_host_path(
    fx: Any, sample: str, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"finish": 0, "pin": 0, "event": 0}
    torch_densify = device.TORCH_OPS[
        SCATTER_OP
    ]  # dense rows cross as flat positions (loaders.samples.payload.Scattered)

    def counted(parts: dict[str, torch.Tensor], meta: dict[str, object]) -> torch.Tensor:
        calls["finish"] += 1
        return torch_densify(parts, meta)

    pin, event = device.Backend.pin, device.Backend.event
    monkeypatch.setitem(device.TORCH_OPS, SCATTER_OP, counted)
    monkeypatch.setattr(
        device.Backend,
        "pin",
        lambda self, t: calls.__setitem__("pin", calls["pin"] + 1) or pin(self, t),
    )
    monkeypatch.setattr(
        device.Backend,
        "event",
        lambda self, s: calls.__setitem__("event", calls["event"] + 1) or event(self, s),
    )
    kw = {"sample": sample, "batch_size": 3 if sample == "sentences" else 24, "seed": 9}
    host = epoch(ShardLoader(ShardDataset(fx.root, **kw), num_workers=workers, timeout=TIMEOUT))  # type: ignore[arg-type]
    assert calls == {
        "finish": 0,
        "pin": 0,
        "event": 0,
    }  # the host path never touches the device path
    dev = epoch(
        ShardLoader(
            ShardDataset(fx.root, **kw),
            num_workers=workers,
            timeout=TIMEOUT,  # type: ignore[arg-type]
            device="cpu",
            ship_csr=True,
        )
    )
    assert len(dev) == len(host) > 0
    per_batch = 1 if sample == "cells" else 2  # x_ctrl and x_pert
    items = (
        -(-len(dev) // 4) if workers else len(dev)
    )  # a worker ships runs of worker_batches=4 as one item
    assert calls["finish"] == per_batch * len(dev) and calls["event"] == items and calls["pin"] > 0
    for h, d in zip(host, dev, strict=True):
        assert h.keys() == d.keys()
        for k in h:
            assert h[k].dtype == d[k].dtype and h[k].shape == d[k].shape, k
            np.testing.assert_array_equal(h[k].numpy(), d[k].numpy(), err_msg=k)


def test_torch_views_equal_the_host_views_of_a_shipped_buffer() -> None:
    """On a device a shipped buffer is cut with one typed view per dtype and one as_strided per
    field (loaders.engine.device.TorchViews); run here on a CPU tensor, every field equals the numpy
    path's view."""
    from loaders.engine.transport import to_shared
    from loaders.modalities.perturbation.ops import Gathered
    from loaders.samples.payload import Payload

    rng = np.random.default_rng(0)
    payloads = []
    for nnz in (0, 17, 5):
        crow = np.r_[0, np.sort(rng.integers(0, nnz + 1, 3)), nnz].astype(np.int32)
        payloads.append(
            Payload(
                arrays={
                    "sample_id": rng.integers(0, 1 << 40, 4),
                    "flag": rng.random(4) > 0.5,
                    "codes": rng.integers(-5, 5, (4, 3)).astype(np.int16),
                    "empty": np.zeros((0, 6), np.float32),
                },
                xs={
                    "X": Gathered(
                        crow,
                        rng.integers(0, 9, nnz).astype(np.int32),
                        rng.random(nnz).astype(np.float32),
                        (4, 9),
                    )
                },
            )
        )
    item = to_shared(payloads, "positions")
    host = device.unpack_batches(item)
    views = device.TorchViews(item.buffer)
    for layout, want in zip(item.layouts, host, strict=True):
        for key, dt, shape, off in layout:
            got = views(dt, shape, off)
            assert got.dtype == want[key].dtype and got.shape == want[key].shape, key
            np.testing.assert_array_equal(got.numpy(), want[key].numpy(), err_msg=key)
