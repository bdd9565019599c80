"""ShardDataset: a torch IterableDataset that yields whole batches from a shardsmith dataset.

Why whole batches: the expensive part of loading is gathering rows (sparse ones, lists); doing it
for 256 units at once with a few vectorised numpy calls avoids per-sample ``__getitem__`` +
collate, whose Python overhead alone exceeds the whole vectorised gather.

Why windows: a batch mixes the units of ``window`` shards (the shuffle buffer). A window's shards
are decoded once, straight into an :class:`~loaders.samples.arena.Arena` (one column per field), and
it serves every batch that falls in it; the next window a worker will touch is decoded meanwhile:
by the decoder process (:mod:`loaders.engine.decoder`) in the training process, by background
threads in DataLoader workers. Threads in the training process itself slowed batch assembly
1.5-1.9x (GIL hand-offs), a separate process 7-10%. At an epoch's last window, the next epoch's
first one is decoded ahead the same way (in the main process and in persistent workers), so an
epoch boundary does not stall the GPU on a whole window's decode. Windows a worker has moved past
are recycled through a per-process buffer pool, so memory is bounded by ~3 windows per worker and
does not grow across epochs.

The order (which units, which batch, which worker) is entirely :mod:`loaders.epoch`. A dataset is
what crosses into a DataLoader worker: its options, index, sample type and this rank's epoch plan
(:class:`~loaders.epoch.layout.EpochPlan`), plain values; plus one slot for the machinery of the
process it is used in (:class:`~loaders.engine.process.ProcessEngine`: threads, buffers, the
decoder process or the broker, live windows), made on first use in each process. A
:class:`~loaders.loader.ShardLoader` tells it how batches leave in one object
(:class:`~loaders.engine.process.LoaderSettings`, :meth:`ShardDataset.configure`).
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loaders import interop
from loaders.engine import decoder
from loaders.engine.process import LoaderSettings, PerProcess, ProcessEngine
from loaders.engine.ring import worker_ring
from loaders.engine.transport import to_shared, to_tensors
from loaders.engine.window import WindowReader
from loaders.epoch import order
from loaders.epoch.layout import EpochPlan, Layout
from loaders.epoch.schedule import Plan
from loaders.format import index_sha256, read_index, read_index_bytes
from loaders.format.index_check import check_index_digest
from loaders.format.integrity import check_on_corrupt
from loaders.options import Engine, Integrity, explain_option_error, resolve
from loaders.remote import ahead
from loaders.remote.ahead import check_limit
from loaders.remote.resolve import resolve_root, side_files_ready
from loaders.samples import SAMPLE_TYPES, check_sample_type, get_sample_type


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ShardDataset(interop.DatasetInfo, IterableDataset):
    """Batches of one split of a dataset folder (``index.json`` + ``shards/``).

    Use it through :class:`~loaders.loader.ShardLoader` (which sets epochs and resume offsets) or a
    ``DataLoader(ds, batch_size=None)``. Its keywords, by group:

    * the order (what decides the batches; a resume state must match them): ``split``,
      ``sample``, ``batch_size``, ``shuffle``, ``seed``, ``drop_last``, ``pad``, ``window``,
      ``rank``, ``world_size``. ``rank``/``world_size`` default to torch.distributed's when it is
      initialised. ``pad=True`` repeats units so every rank gets ceil(N/world) of them;
      ``pad=False`` drops the last N mod world.
    * the sample type: ``sample`` names a registered one (:mod:`loaders.samples`: a built-in
      modality's or a plug-in's; default: the first the index lists, its kind's primary one), and
      ``**sample_options`` are its load-time options, e.g. a crop size, or the form its deferred
      items are delivered in (the single-cell types' ``densify=False`` / ``torch_sparse=True``:
      see their modality's docs).
    * ``engine`` (:class:`~loaders.options.Engine`: ``decode_process``, ``decode_ahead``,
      ``decode_threads``, ``batches_ahead``, ``decode_timeout``): how windows are decoded; each
      field is also a keyword here.
    * ``integrity`` (:class:`~loaders.options.Integrity`: ``verify``, ``on_corrupt``; also
      keywords): ``verify=True`` checks each shard's sha256 against the opened index on its first
      read in a process and whenever a file of it changes (``"always"``: every read; ``False``:
      only that no zarr chunk is missing); integer codes are checked against their bounds (the
      sample type's ``field_bounds``, e.g. vocabularies). ``on_corrupt="raise"`` names the failing
      shard, ``"skip"`` leaves its units out and lists it in :attr:`skipped_shards`. A rebuild
      that removed or changed the opened generation's shards raises ``DatasetRebuilt`` (reopen).
      ``index.json`` itself is checked at open, as ``shardsmith verify`` checks it, against the
      digest its build stored (:func:`~loaders.format.index_check.check_index_digest`): an edited index (a
      shard entry removed, labels swapped) is a ``FormatError``.
    * ``root`` may be a URL (``s3://bucket/prefix/ds``): ``cache_dir`` (default
      ``$SHARDSMITH_CACHE``, else the user cache folder), ``cache_limit`` (bytes, default none)
      and ``storage_options`` (the store's settings over the environment's) say how its shards
      reach this node: downloaded once per node, whole and checked, prefetched a few windows
      ahead (docs/REMOTE.md). ``offline=True`` opens the node's last copy of its index without
      the server (every shard of ``split`` must be cached); an unreachable server does the same,
      with a warning naming the copy's age.
    * ``trust_plugins`` (as Hugging Face's ``trust_remote_code``): the plug-in modules the index
      names (``plugins``) are imported only if they are installed modalities, or allowed here
      (``True``: every one the index names; or a list of names) or by
      ``$SHARDSMITH_TRUST_PLUGINS``; the allowance is passed on to the decoder process and the
      DataLoader workers through that variable (:mod:`loaders.plugins`).
    """

    def __init__(
        self,
        root: str | Path,
        split: str = "train",
        sample: str | None = None,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        pad: bool = True,
        window: int = 4,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        engine: Engine | None = None,
        integrity: Integrity | None = None,
        decode_ahead: bool | None = None,
        batches_ahead: int | None = None,
        decode_threads: int | None = None,
        decode_process: bool | None = None,
        decode_timeout: float | None = None,
        verify: bool | str | None = None,
        on_corrupt: str | None = None,
        cache_dir: str | Path | None = None,
        cache_limit: int | None = None,
        storage_options: dict[str, Any] | None = None,
        trust_plugins: bool | Sequence[str] = False,
        offline: bool = False,
        **sample_options: Any,
    ) -> None:
        super().__init__()
        self.engine = resolve(
            engine,
            Engine,
            decode_process=decode_process,
            decode_ahead=decode_ahead,
            decode_threads=decode_threads,
            batches_ahead=batches_ahead,
            decode_timeout=decode_timeout,
        )
        self.integrity = resolve(integrity, Integrity, verify=verify, on_corrupt=on_corrupt)
        # a URL (s3://...): its index fetched now, shards into the node's cache (loaders/remote)
        self.url, self.root, remote = resolve_root(
            root,
            cache_dir,
            cache_limit,
            storage_options,
            trust_plugins,
            offline=offline,
            split=split,
            wait=False,  # the condition table downloads meanwhile; waited for below
        )
        data = read_index_bytes(
            self.root
        )  # read once: every process of this loader decodes this generation
        index = read_index(self.root, data, trust_plugins)
        # the index's own content against its digest: an edited shard list or vocabulary would be
        # served without an error (the decoder process decodes these same bytes)
        check_index_digest(index)
        present = sorted({s.split for s in index.shards})
        if split not in present:
            raise ValueError(f"unknown split {split!r} for {self.root} (valid: {present})")
        if sample is None:  # the index's first sample type: its kind's primary one
            if not index.samples:
                raise ValueError(f"{self.root} lists no sample types: name one (sample=...)")
            sample = index.samples[0]
        try:
            self.sample_type = get_sample_type(sample, **sample_options)
        except TypeError as e:  # a keyword the sample type does not take: say where it belongs
            cls = SAMPLE_TYPES.get(sample)
            raise explain_option_error(e, cls, sample, sample_options, _OWN_OPTIONS) from None
        check_sample_type(self.sample_type, index)
        if batch_size < 1 or window < 1 or seed < 0:
            raise ValueError("batch_size and window must be >= 1 and seed >= 0")
        d_rank, d_world = _dist_rank_world()
        self.rank = d_rank if rank is None else int(rank)
        self.world_size = d_world if world_size is None else int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside [0, {self.world_size})")
        self.split, self.sample, self.batch_size, self.shuffle, self.seed = (
            split,
            sample,
            batch_size,
            shuffle,
            seed,
        )
        self.drop_last, self.pad, self.window = drop_last, pad, window
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
        eng = self.engine
        self.decode_process = (
            decoder.AVAILABLE if eng.decode_process is None else bool(eng.decode_process)
        )
        # Defaults measured on a 2-core node (docs/LOADER.md): there the decoder process already
        # takes the second core, and an assembly thread would be a third busy thread (0.55x vs 0.62x
        # of the baseline).
        self.decode_ahead = eng.decode_ahead
        self.batches_ahead = (
            (2 if cores >= 4 else 0)
            if eng.batches_ahead is None
            else max(0, int(eng.batches_ahead))
        )
        self.decode_threads = max(
            1, min(window, cores, 4) if eng.decode_threads is None else int(eng.decode_threads)
        )
        # the decoder process takes one core unless told otherwise
        self.decoder_threads = 1 if eng.decode_threads is None else self.decode_threads

        # integrity (loaders/format/integrity.py): every shard's sha256 and chunks checked before it is
        # served; on_corrupt="skip" drops a failing shard's units from their batches and counts it
        # (skipped_shards)
        verify = self.integrity.verify
        if verify not in (True, False, "always"):
            raise ValueError(
                f"verify={verify!r}: expected True (hash each shard once per process, again whenever "
                "a file of it changes), 'always' (hash every read) or False (chunks counted only)"
            )
        self.verify, self.on_corrupt = verify, check_on_corrupt(self.integrity.on_corrupt)
        self.reader = WindowReader.from_spec(
            {
                "root": str(self.root),
                "split": split,
                "sample": self.sample_type.get_config(),
                "window": window,
                "seed": seed,
                "shuffle": shuffle,
                "index": data.decode(),
                "index_sha256": index_sha256(data),
                "verify": self.verify,
                "on_corrupt": self.on_corrupt,
                "remote": remote,
            }
        )
        self._cache_limit = remote["limit"] if remote else None
        if remote:
            check_limit(remote["limit"], self.url, [e.bytes for e in self.reader.entries], window)
        self.fingerprint = (
            self.reader.fingerprint()
        )  # what a resume state must match (loaders/epoch/resume.py)
        self.sample_type = self.reader.sample  # bound to the index
        self.encoding = index.encoding
        self.vocabularies = (
            index.vocabularies
        )  # code -> label per obs field (e.g. to size a classifier)
        self.entries, self.paths, self.counts = (
            self.reader.entries,
            self.reader.paths,
            self.reader.counts,
        )
        self.n_cols = getattr(self.sample_type, "n_cols", None)
        self.plan = EpochPlan(
            self.counts,
            self.entries,
            self.sample_type,
            batch_size=batch_size,
            seed=seed,
            window=window,
            shuffle=shuffle,
            pad=pad,
            drop_last=drop_last,
            rank=self.rank,
            world_size=self.world_size,
        )
        self.settings = LoaderSettings()
        self._skipped: dict[int, str] = {}  # shard id -> why, skipped in this process
        self._engine: PerProcess[ProcessEngine] = PerProcess()
        if remote:  # the first windows start downloading now, while the trainer sets up
            ahead.at_open(self)
            side_files_ready(self.root)

    def configure(self, settings: LoaderSettings) -> None:
        """How batches leave (``ShardLoader`` calls it once, before its workers start)."""
        self.settings = settings
        plan = self.plan
        plan.shared, plan.partitions = settings.shared, settings.partitions
        plan.set_iteration(plan.epoch, plan.start)  # into the shared slots, if any

    def engine_here(self) -> ProcessEngine:
        """This process's machinery for this dataset (made on first use in each process)."""
        return self._engine.get(lambda parent: ProcessEngine(self, parent))

    @property
    def decode_timeout(self) -> float:
        """Seconds the decoder process may stay silent: the engine's, or the loader's ``timeout``
        when shorter."""
        own, loader = float(self.engine.decode_timeout), self.settings.timeout
        return min(own, loader) if loader > 0 else own

    # -- sizes and iteration state ---------------------------------------------------------------
    @property
    def n_units(self) -> int:
        """Units of the split (all ranks together)."""
        return int(self.counts.sum())

    def __len__(self) -> int:
        return self.num_batches()

    def check_cache_limit(self, workers: int) -> None:
        """Refuse a ``cache_limit`` below what ``workers`` DataLoader workers keep in flight (each
        pins its own windows); `ShardLoader` calls it, the open checked one reading process."""
        if self._cache_limit is not None:
            sizes = [e.bytes for e in self.entries]
            check_limit(self._cache_limit, self.url, sizes, self.window, workers)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's order (and start it from its first batch)."""
        self.plan.set_iteration(epoch, 0)

    # -- the epoch plan, as the loader, resume states and remote prefetch ask for it ---------
    @property
    def global_batch(self) -> int:
        """Units of one step over all ranks (fixed-size batches): what a resume must keep."""
        return self.plan.global_batch

    @property
    def budgeted(self) -> bool:
        """Whether the sample type batches by a cost budget (:mod:`loaders.epoch.budget`)."""
        return self.plan.budgeted

    def num_batches(self, epoch: int | None = None) -> int:
        """Batches per epoch on this rank (see :meth:`EpochPlan.num_batches`)."""
        return self.plan.num_batches(epoch)

    def layout(self, epoch: int) -> Layout:
        """``(K, offset, base)`` of ``epoch``: the resumed one's, else this world's own."""
        return self.plan.layout(epoch)

    def units_per_rank(self) -> int:
        """Units a rank takes in an epoch laid out on this world."""
        return self.plan.units_per_rank()

    def _plans(self, epoch: int, wstarts: np.ndarray) -> Callable[[int], Plan]:
        return self.plan.plans(epoch, wstarts)  # loaders.remote.ahead reads a rank's windows

    # -- shards skipped (on_corrupt="skip") ------------------------------------------------------
    def note_skipped(self, skipped: list[list[Any]]) -> None:
        for s, why in skipped:
            if int(s) not in self._skipped:
                warnings.warn(f"on_corrupt='skip': skipping {why}", RuntimeWarning, stacklevel=3)
            self._skipped[int(s)] = str(why)
            if self.settings.skip_flags is not None:
                self.settings.skip_flags[int(s)] = 1

    @property
    def skipped_shards(self) -> list[str]:
        """Files of the shards skipped so far (``on_corrupt="skip"``), by this process and its
        DataLoader workers; their units were left out of their batches."""
        ids = set(self._skipped)
        if self.settings.skip_flags is not None:
            ids.update(i for i, f in enumerate(self.settings.skip_flags) if f)
        return [self.entries[i].file for i in sorted(ids)]

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """Batches (dicts of tensors). In a worker of a :class:`~loaders.loader.ShardLoader`
        (``shipping``):
        :class:`Shipped` runs of ``shipping.batches`` batches, which the loader splits
        (:func:`loaders.engine.device.unpack_batches`); in a plain DataLoader's worker, dicts that torch
        ships."""
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 0)
        epoch, start = self.plan.iteration()
        runs = order.worker_runs(self.num_batches(epoch), worker, n_workers, start, self.group())
        if not len(runs):
            return
        served = self.engine_here().serve(epoch, runs.batches(), worker, n_workers)
        if info is None:
            yield from served
            return
        shipping, output = self.settings.shipping, self.settings.output
        if shipping is None:  # a plain DataLoader: it gets what it can use, at torch's cost
            yield from (to_tensors(p, output) for p in served)
            return
        ring = worker_ring(shipping.ring_slots)
        try:
            for run in runs:
                yield to_shared(list(islice(served, len(run))), output, ring)
        finally:
            close = getattr(served, "close", None)
            if close is not None:
                close()

    def group(self) -> int:
        """Batches a DataLoader worker ships per item (1 in the main process)."""
        shipping = self.settings.shipping
        return shipping.batches if shipping is not None and get_worker_info() is not None else 1


# ShardDataset's own keywords: what a misspelt sample option is compared with
_OWN_OPTIONS = [
    p
    for p in inspect.signature(ShardDataset.__init__).parameters
    if p not in ("self", "sample_options")
]
