"""``ShardDataModule``: a Lightning ``LightningDataModule`` over :class:`~loaders.ShardLoader`
(extra ``lightning``: ``pip install -e ".[lightning]"``).

What it wires, which a plain ``DataLoader`` in Lightning would get wrong:

* **epochs**: every train iteration starts with ``set_epoch(trainer.current_epoch)``, so each epoch
has its
  own order (Lightning calls ``set_epoch`` only on a ``DataLoader``'s sampler; ours is not one);
* **DDP ranks**: datasets are made in ``setup`` with the trainer's ``global_rank`` / ``world_size``
(the loader
  shards units itself: Lightning's distributed sampler does not apply to it);
* **resume**: ``state_dict`` (saved in every checkpoint) holds the train loader's state with the
number of
  batches the trainer has *processed* this epoch (not the loader's count, which includes the batch
  Lightning
  prefetches); ``fit(ckpt_path=...)`` mid-epoch then yields exactly the epoch's remaining batches.

Lightning is imported when ``ShardDataModule`` is first looked up, not when ``loaders`` is imported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from loaders.dataset import ShardDataset
from loaders.format import read_index
from loaders.interop import splits
from loaders.loader import ShardLoader

INSTALL = 'pip install -e ".[lightning]"  (or: pip install lightning)'


def _lightning() -> Any:
    try:
        import lightning.pytorch as pl  # optional extra lightning
    except ModuleNotFoundError:
        try:
            import pytorch_lightning as pl  # optional extra lightning
        except ModuleNotFoundError:
            raise ModuleNotFoundError(f"loaders.lightning needs Lightning: {INSTALL}") from None
    return pl


class _EpochLoader:
    """What ``*_dataloader()`` returns: a ShardLoader whose every iteration first sets the trainer's
    epoch (and applies a pending resume state of that epoch)."""

    def __init__(self, module: Any, split: str) -> None:
        self.module, self.split = module, split

    @property
    def loader(self) -> Any:
        return self.module.loaders[self.split]

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        trainer = self.module.trainer
        epoch = int(trainer.current_epoch) if trainer is not None and self.split == "train" else 0
        self.loader.set_epoch(epoch)
        pending = self.module.pending_state if self.split == "train" else None
        if pending is not None and int(pending["epoch"]) == epoch:
            self.loader.load_state_dict(pending)
        if self.split == "train":
            self.module.pending_state = None
        return iter(self.loader)


def _make_class() -> type:
    pl = _lightning()

    class ShardDataModule(pl.LightningDataModule):  # type: ignore[misc, name-defined]
        """Train / val / test loaders of one dataset folder. ``dataset_options`` go to every
        :class:`~loaders.ShardDataset` (``sample``, ``batch_size``, ``seed``, sample-type
        options...), ``loader_options`` to every :class:`~loaders.ShardLoader` (``num_workers``,
        ``device``...). Train batches are shuffled, val/test ones are not. Splits the dataset
        lacks get no loader."""

        def __init__(
            self,
            root: str | Path,
            sample: str | None = None,
            batch_size: int = 256,
            seed: int = 0,
            splits: Sequence[str] = ("train", "val", "test"),
            loader_options: Mapping[str, Any] | None = None,
            **dataset_options: Any,
        ) -> None:
            super().__init__()
            self.root, self.sample, self.batch_size, self.seed = (
                Path(root),
                sample,
                batch_size,
                seed,
            )
            self.wanted = tuple(splits)
            self.loader_options = dict(loader_options or {})
            self.dataset_options = dataset_options
            self.loaders: dict[str, ShardLoader] = {}
            self.pending_state: dict[str, Any] | None = None

        def setup(self, stage: str | None = None) -> None:

            trainer = self.trainer
            rank = int(trainer.global_rank) if trainer is not None else None
            world = int(trainer.world_size) if trainer is not None else None
            present = splits(read_index(self.root))
            for split in self.wanted:
                if split in present and split not in self.loaders:
                    ds = ShardDataset(
                        self.root,
                        split=split,
                        sample=self.sample,
                        batch_size=self.batch_size,
                        shuffle=split == "train",
                        seed=self.seed,
                        rank=rank,
                        world_size=world,
                        **self.dataset_options,
                    )
                    self.loaders[split] = ShardLoader(ds, **self.loader_options)

        def _loader(self, split: str) -> Any:
            if split not in self.loaders:
                return []  # Lightning skips an empty loader (a dataset without this split)
            return _EpochLoader(self, split)

        def train_dataloader(self) -> Any:
            return self._loader("train")

        def val_dataloader(self) -> Any:
            return self._loader("val")

        def test_dataloader(self) -> Any:
            return self._loader("test")

        def state_dict(self) -> dict[str, Any]:
            loader = self.loaders.get("train")
            if loader is None:
                return {"train": self.pending_state} if self.pending_state is not None else {}
            state = loader.state_dict()
            trainer = self.trainer
            if trainer is not None:  # what the trainer has stepped on, not what was prefetched
                state["epoch"] = int(trainer.current_epoch)
                state["batches_done"] = int(
                    trainer.fit_loop.epoch_loop.batch_progress.current.processed
                )
            return {"train": state}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.pending_state = state_dict.get("train")

    ShardDataModule.__module__, ShardDataModule.__qualname__ = (
        __name__,
        "ShardDataModule",
    )  # checkpoint key
    return ShardDataModule


_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "ShardDataModule":
        if _CLASS is None:
            _CLASS = _make_class()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
