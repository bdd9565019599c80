"""``ShardDataModule``: a Lightning ``LightningDataModule`` over :class:`~loaders.ShardLoader`
(extra ``lightning``: ``pip install -e ".[lightning]"``).

What it wires, which a plain ``DataLoader`` in Lightning would get wrong:

* **epochs**: every train iteration starts with ``set_epoch(trainer.current_epoch)``, so each epoch
has its
  own order (Lightning calls ``set_epoch`` only on a ``DataLoader``'s sampler; ours is not one);
* **DDP ranks**: datasets are made in ``setup`` with the trainer's ``global_rank`` / ``world_size``
(the loader
  shards units itself: Lightning's distributed sampler does not apply to it);
* **resume**: the train loader is *stateful* for Lightning (``state_dict`` / ``load_state_dict``
  on what ``train_dataloader()`` returns), so Lightning stores its state in every checkpoint
  itself (and does not warn that the loader is not resumable): the number of batches the trainer
  has *processed* this epoch (not the loader's count, which includes the batch Lightning
  prefetches). ``fit(ckpt_path=...)`` mid-epoch then yields exactly the epoch's remaining
  batches, also on another ``devices`` / ``num_nodes`` (:mod:`loaders.epoch.elastic`) when the global
  batch is the same: pass ``global_batch_size`` instead of ``batch_size`` so each device takes its
  share of it.

Lightning is imported when ``ShardDataModule`` is first looked up, not when ``loaders`` is imported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from loaders.dataset import ShardDataset
from loaders.epoch.resume import seal
from loaders.format import read_index
from loaders.interop import splits
from loaders.loader import ShardLoader
from loaders.remote.resolve import resolve_root
from loaders.remote.store import is_url

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

    def state_dict(self) -> dict[str, Any]:
        """Lightning's hook (a stateful loader): the train loader's resume state, or nothing."""
        return self.module.train_state() if self.split == "train" else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Applied at the next train iteration, once the trainer's epoch is known."""
        if self.split == "train" and state:
            self.module.pending_state = state

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
        lacks get no loader; ``val_dataloader`` / ``test_dataloader`` exist only when ``splits``
        names val / test (``splits=["train"]``: no val loop, and no Lightning warning about a
        missing ``validation_step``)."""

        def __init__(
            self,
            root: str | Path,
            sample: str | None = None,
            batch_size: int = 256,
            seed: int = 0,
            splits: Sequence[str] = ("train", "val", "test"),
            loader_options: Mapping[str, Any] | None = None,
            global_batch_size: int | None = None,
            **dataset_options: Any,
        ) -> None:
            super().__init__()
            # a URL stays a string: Path("s3://b/ds") is the local path "s3:/b/ds"
            self.root, self.sample, self.batch_size, self.seed = (
                root if is_url(root) else Path(root),
                sample,
                batch_size,
                seed,
            )
            self.wanted = tuple(splits)
            self.loader_options = dict(loader_options or {})
            self.dataset_options = dataset_options
            self.global_batch_size = global_batch_size  # batch_size = it / world size
            self.loaders: dict[str, ShardLoader] = {}
            self.pending_state: dict[str, Any] | None = None
            # val/test loader hooks only for the splits asked for: Lightning takes a defined
            # val_dataloader for a val loop and warns when the model has no validation_step
            for split in ("val", "test"):
                if split in self.wanted:
                    setattr(self, f"{split}_dataloader", partial(self._loader, split))

        def setup(self, stage: str | None = None) -> None:

            trainer = self.trainer
            rank = int(trainer.global_rank) if trainer is not None else None
            world = int(trainer.world_size) if trainer is not None else None
            opts = self.dataset_options
            local = resolve_root(
                self.root,
                opts.get("cache_dir"),
                opts.get("cache_limit"),
                opts.get("storage_options"),
                opts.get("trust_plugins", False),
                offline=bool(opts.get("offline", False)),
            )[1]
            present = splits(read_index(local, None, opts.get("trust_plugins", False)))
            batch_size = self.batch_size
            if self.global_batch_size is not None:
                per, left = divmod(self.global_batch_size, world or 1)
                if left or per < 1:
                    raise ValueError(
                        f"global_batch_size={self.global_batch_size} does not divide among "
                        f"{world or 1} devices"
                    )
                batch_size = per
            for split in self.wanted:
                if split in present and split not in self.loaders:
                    ds = ShardDataset(
                        self.root,
                        split=split,
                        sample=self.sample,
                        batch_size=batch_size,
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

        def state_dict(self) -> dict[str, Any]:
            """Nothing: Lightning saves the train loader's state itself (it is stateful, see
            ``_EpochLoader``); :meth:`load_state_dict` still reads earlier versions' copy."""
            return {}

        def train_state(self) -> dict[str, Any]:
            loader = self.loaders.get("train")
            if loader is None:
                return dict(self.pending_state or {})
            state = loader.state_dict()
            trainer = self.trainer
            if trainer is not None:  # what the trainer has stepped on, not what was prefetched
                state["epoch"] = int(trainer.current_epoch)
                state["batches_done"] = int(
                    trainer.fit_loop.epoch_loop.batch_progress.current.processed
                )
                seal(state)  # its digest over the fields as saved (loaders.epoch.resume)
            return state

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            if state_dict.get("train"):  # a checkpoint of an earlier version
                self.pending_state = state_dict["train"]

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
