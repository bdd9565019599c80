"""loaders.lightning.ShardDataModule in a real Lightning Trainer on CPU: epochs reshuffle, every
cell once per epoch, DDP ranks from the trainer, and a mid-epoch checkpoint resumes with exactly
the remaining batches."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pl = pytest.importorskip(
    "lightning.pytorch", reason='Lightning not installed: pip install -e ".[lightning]"'
)

from loaders.lightning import ShardDataModule  # noqa: E402

N_GENES = 20


class Tiny(pl.LightningModule):
    def __init__(self, log: Path | None = None) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(N_GENES, 1)
        self.seen: list[tuple[int, list[int]]] = []
        self.val_seen: list[int] = []
        self.log_path = log  # spawned ranks: what each served, one JSON line a batch

    def training_step(self, batch: dict[str, torch.Tensor], i: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch["sample_id"].tolist()))
        if self.log_path is not None:
            with self.log_path.open("a") as f:
                f.write(json.dumps([self.current_epoch, batch["sample_id"].tolist()]) + "\n")
        return self.lin(batch["X"]).pow(2).mean()

    def validation_step(self, batch: dict[str, torch.Tensor], i: int) -> None:
        self.val_seen += batch["sample_id"].tolist()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class SaveAt(pl.Callback):
    """Save a checkpoint after batch ``k`` of epoch ``e`` (every rank takes part)."""

    def __init__(self, path: Path, epoch: int, k: int) -> None:
        self.path, self.epoch, self.k = path, epoch, k

    def on_train_batch_end(
        self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.k:
            trainer.save_checkpoint(self.path)


class StopAt(pl.Callback):
    """Save a checkpoint after batch ``k`` of epoch ``e``, then stop (a job killed mid-epoch)."""

    def __init__(self, path: Path, epoch: int, k: int) -> None:
        self.path, self.epoch, self.k = path, epoch, k

    def on_train_batch_end(
        self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.k:
            trainer.save_checkpoint(self.path)
            # Lightning shuts down and exits (SystemExit), like a killed job
            raise KeyboardInterrupt


def _trainer(**kw: Any) -> Any:
    kw.setdefault("devices", 1)
    return pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kw,
    )


@pytest.fixture(scope="module")
def root(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lightning") / "ds"
    build_dataset(
        root, "shards", n_shards=6, cells=60, genes=N_GENES, splits=("train", "train", "val")
    )
    return root


def _dm(root: Path) -> Any:
    return ShardDataModule(root, sample="cells", batch_size=16, seed=3, decode_process=False)


def test_two_epoch_fit(root: Path) -> None:
    model = Tiny()
    _trainer().fit(model, _dm(root))
    by_epoch = {e: [i for ep, ids in model.seen if ep == e for i in ids] for e in (0, 1)}
    assert len(by_epoch[0]) == 240 and sorted(by_epoch[0]) == sorted(
        by_epoch[1]
    )  # each train cell once per epoch
    assert len(set(by_epoch[0])) == 240
    assert by_epoch[0] != by_epoch[1]  # set_epoch wired: a new order each epoch
    assert len(model.val_seen) == 2 * 120 and len(set(model.val_seen)) == 120


def test_mid_epoch_checkpoint_resumes_exactly(root: Path, tmp_path: Path) -> None:
    full = Tiny()
    _trainer().fit(full, _dm(root))
    ckpt = tmp_path / "mid.ckpt"
    first = Tiny()
    with pytest.raises(SystemExit):
        _trainer(callbacks=[StopAt(ckpt, epoch=1, k=4)]).fit(first, _dm(root))
    assert ckpt.exists() and len(first.seen) == 15 + 5
    rest = Tiny()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer().fit(rest, _dm(root), ckpt_path=ckpt)
    assert first.seen + rest.seen == full.seen  # nothing repeated, nothing skipped
    assert not [w for w in caught if "not resumable" in str(w.message)]
    assert (
        torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"][
            0
        ]["batches_done"]
        == 5
    )  # Lightning's own copy of the loader state


def test_ranks_come_from_the_trainer(root: Path) -> None:
    dm = _dm(root)
    dm.trainer = SimpleNamespace(global_rank=1, world_size=2, current_epoch=0)
    dm.setup("fit")
    ds = dm.loaders["train"].dataset
    assert (ds.rank, ds.world_size) == (1, 2)
    assert len(dm.train_dataloader()) == 8  # 240 cells / 2 ranks / 16 per batch, rounded up


@pytest.mark.process
def test_resume_on_another_number_of_devices(root: Path, tmp_path: Path) -> None:
    """2 devices (ddp_spawn, gloo) checkpoint mid-epoch 1; the fit resumes on 1 device with the same
    global batch: epoch 1 is every train cell exactly once (240 cells, 32 a step)."""
    ckpt, log = tmp_path / "mid.ckpt", tmp_path / "served.jsonl"

    def dm() -> Any:
        return ShardDataModule(
            root, sample="cells", global_batch_size=32, seed=3, decode_process=False
        )

    two = _trainer(devices=2, strategy="ddp_spawn", max_steps=8 + 5, callbacks=[SaveAt(ckpt, 1, 4)])
    two.fit(Tiny(log), dm())
    first = [json.loads(line) for line in log.read_text().splitlines()]
    assert ckpt.exists() and len(first) == 2 * 13
    one = Tiny()
    _trainer().fit(one, dm(), ckpt_path=ckpt)
    epoch1 = [i for e, ids in first if e == 1 for i in ids] + [
        i for e, ids in one.seen if e == 1 for i in ids
    ]
    assert [len(ids) for _, ids in one.seen] == [32, 32, 16]  # steps 5-7 of epoch 1, on one device
    assert sorted(epoch1) == sorted(i for e, ids in first if e == 0 for i in ids)
    assert len(epoch1) == len(set(epoch1)) == 240
