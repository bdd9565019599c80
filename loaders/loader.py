"""ShardLoader: a DataLoader over a ShardDataset with epochs, exact mid-epoch resume and device
feeding.

Resume rules (also in docs/LOADER.md):

* ``state_dict()`` counts the batches *handed to you* this epoch (the one you are holding included);
  ``load_state_dict(state)`` makes the next iteration yield exactly the remaining batches of that
  epoch, whatever ``num_workers`` was before or is now.
* Elastic: a state loads on another world size when the global batch (world size x batch size)
  is the same; the rest of the epoch keeps the state's canonical partitions, so every unit not yet
  served is served (:mod:`loaders.epoch.elastic`; budget batches: every canonical batch not yet served).
  Another global batch, seed, sample, split, window, shuffle, pad, drop_last, dataset or batch
  budget raises ``ValueError``.
* All ranks consume the same number of batches, so rank 0's state can be loaded on every rank.
* Workers are persistent by default (``persistent_workers=True``): respawning them every epoch
  cost most of their gain (docs/LOADER.md, "Measured").
* ``set_epoch(e)`` with the epoch being resumed keeps the resume point; another epoch clears it.
* A state carries the dataset's fingerprint and is type-checked (:mod:`loaders.epoch.resume`).

``timeout`` (seconds; default :data:`DEFAULT_TIMEOUT_S`, 300) bounds every wait: on the DataLoader
workers (a stopped or stuck worker: its batch does not come within ``timeout``, the workers are
killed and :class:`LoaderTimeout` names them by pid and state) and on the decoder process (silent
for the shorter of ``timeout`` and its ``decode_timeout``, 30 s by default: killed, decoding moves
into the training process with a warning). A default bound because torch's default (``timeout=0``)
leaves a trainer hanging for good on one SIGSTOPped worker; no wait is unbounded unless asked:
``timeout=None`` (or 0, torch's spelling) turns the workers' bound off.
"""

from __future__ import annotations

import multiprocessing as mp
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from loaders.dataset import ShardDataset
from loaders.engine.device import DeviceFeeder
from loaders.engine.process import LoaderSettings
from loaders.engine.transport import RunShipping
from loaders.engine.watchdog import LoaderTimeout, WorkerWatch
from loaders.epoch.elastic import check_partitions
from loaders.epoch.layout import SHARED_SLOTS
from loaders.epoch.resume import (
    STATE_VERSION,
    EpochFacts,
    check_digest,
    check_done,
    check_layout,
    check_state,
    layout_of,
    seal,
)

__all__ = ["DEFAULT_TIMEOUT_S", "LoaderTimeout", "ShardLoader"]

# The longest a trainer waits for a worker's batch unless told otherwise: far above any batch's time
# (a window's decode is ~0.3 s here, a worker's start a few seconds), far below "for good".
DEFAULT_TIMEOUT_S = 300.0


class ShardLoader:
    """Iterate a :class:`ShardDataset` for training: ``set_epoch``, ``len``, ``state_dict``.
    Keywords by group:

    * workers: ``num_workers``: processes gathering and assembling batches in parallel; the
      windows are decoded once, by this process's decoder process, and mapped by every worker
      (:mod:`loaders.engine.broker`). ``worker_batches``: consecutive batches a worker ships as one
      item (one buffer, in a reused slot of the worker's :mod:`loaders.engine.ring`): the per-item
      cost of the DataLoader's queues and pickling is paid once per run. ``prefetch_factor``
      counts items (runs), as in torch: 2 items of 4 batches keep 8 batches ahead per worker.
      ``persistent_workers`` (default **True**, unlike torch: workers, their decode-ahead and
      their broker connection live from one epoch to the next: respawned every epoch they kept
      0.13-0.44x of the rate, docs/LOADER.md; ``False`` restores torch's behaviour),
      ``multiprocessing_context`` as in torch; ``timeout``: seconds a
      worker's batch may take (default 300; ``None`` or 0: no bound) before the workers are
      killed and :class:`LoaderTimeout` names the stopped one; it also caps the decoder
      process's silence (see the module docstring).
    * transport: ``device``: where batches should end up (``None`` keeps them on the CPU).
      ``device_finish``: deferred items (:mod:`loaders.samples.payload`) cross as their parts, in their
      device form, and are finished there (default: on CUDA); ``device="cpu"`` with
      ``device_finish=True`` runs that path on the host. ``pin_memory``, ``device_prefetch``
      (batches staged ahead on the device's side stream). ``ship_csr`` is the old name of
      ``device_finish``.

    The loader configures its dataset (output form, shared epoch state): one loader per dataset.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        num_workers: int = 0,
        pin_memory: bool = True,
        prefetch_factor: int = 2,
        device: torch.device | str | None = None,
        persistent_workers: bool = True,
        multiprocessing_context: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT_S,
        device_prefetch: int = 2,
        device_finish: bool | None = None,
        worker_batches: int = 4,
        *,
        partitions: int | None = None,
        ship_csr: bool | None = None,
    ) -> None:
        if not isinstance(dataset, ShardDataset):
            raise TypeError("ShardLoader needs a ShardDataset")
        if ship_csr is not None:  # the old name (kept: scripts and docs use it)
            if device_finish is not None and bool(device_finish) != bool(ship_csr):
                raise TypeError("device_finish and its old name ship_csr disagree: give one")
            device_finish = ship_csr
        self.dataset = dataset
        dev = None if device is None else torch.device(device)
        if dev is not None and dev.type == "cuda" and not torch.cuda.is_available():
            warnings.warn(
                "device is CUDA but torch.cuda.is_available() is False: batches stay on the CPU",
                RuntimeWarning,
                stacklevel=2,
            )
            dev = None
        cuda = dev is not None and dev.type == "cuda"
        self.device = dev
        self.device_finish = cuda if device_finish is None else bool(device_finish)
        # shipped for a device: every deferred item's parts in its device form, finished there;
        # otherwise finished here (each item delivered as its sample type made it: engine/transport.py)
        output = "positions" if self.device_finish else "dense"
        # batches made here for a device: one buffer each (pinned on CUDA), crossing in one copy
        # like a worker's
        staging = (cuda and pin_memory) if dev is not None and self.device_finish else None
        self._feeder = DeviceFeeder(dev, device_prefetch)
        dataset.check_cache_limit(num_workers)  # a URL's cache: the workers' windows fit the limit
        if worker_batches < 1 or (num_workers > 0 and prefetch_factor < 1):
            raise ValueError(
                f"worker_batches ({worker_batches}) and prefetch_factor ({prefetch_factor}) must be >= 1"
            )
        # ring slots: the items a worker may have out at once: its prefetched ones, the one being
        # unpacked, the one whose batch the trainer holds, the pin thread's, and those the device
        # feeder stages; beyond, fresh segments
        shipping = (
            RunShipping(
                int(worker_batches),
                prefetch_factor + 3 + -(-max(1, device_prefetch) // int(worker_batches)),
            )
            if num_workers > 0
            else None
        )
        persistent = persistent_workers and num_workers > 0
        ctx = mp.get_context(multiprocessing_context)
        # persistent workers outlive iterations: epoch, start, layout from shared memory; workers
        # report the shards they skip in shared flags
        shared = ctx.RawArray("q", SHARED_SLOTS) if persistent else None
        skip = num_workers > 0 and dataset.on_corrupt == "skip"
        skip_flags = ctx.RawArray("b", len(dataset.entries)) if skip else None
        timeout = 0.0 if timeout is None else float(timeout)
        if timeout < 0 or timeout != timeout:
            raise ValueError(f"timeout={timeout!r}: seconds >= 0 (None or 0: no bound)")
        self.timeout = timeout
        if partitions is not None:  # budget batches: any K >= 1 (its plan is made for K)
            k = int(partitions)
            check_partitions(k, k if dataset.budgeted else dataset.global_batch)
        dataset.configure(
            LoaderSettings(
                output=output,
                staging=staging,
                shipping=shipping,
                timeout=timeout,  # the decoder answers to it too when shorter (it beats while it works)
                partitions=None if partitions is None else int(partitions),
                shared=shared,
                skip_flags=skip_flags,
            )
        )
        self._loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            pin_memory=pin_memory and cuda,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent,
            multiprocessing_context=multiprocessing_context if num_workers > 0 else None,
            timeout=timeout if num_workers > 0 else 0,
        )
        self._epoch = 0
        self._done = 0
        self._resume: int | None = None
        self._layout: tuple[int, int, int] | None = None  # a resumed epoch's (K, offset, base)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def batches_done(self) -> int:
        return self._done

    def __len__(self) -> int:
        """Batches per epoch on this rank (a resumed epoch yields fewer); with a sample type that
        batches by a cost budget (its ``budget``) the count is this loader's epoch's."""
        return self.dataset.num_batches(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0 (got {epoch})")
        if epoch != self._epoch:
            self._epoch, self._done, self._resume, self._layout = int(epoch), 0, None, None
            self.dataset.plan.set_iteration(self._epoch, 0)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        start = self._resume or 0
        self._resume = None
        self._done = start
        self.dataset.plan.set_iteration(self._epoch, start, self._layout)
        if start >= len(self):
            return
        # one process: the dataset's own batches (torch's single-process iterator adds a
        # default_convert walk, a profiler record and a pin per tensor per batch; the device feeder
        # stages and pins what it needs)
        direct = self._loader.num_workers == 0
        if self._loader.num_workers > 0:
            # workers map the windows this process's decoder decodes once
            self.dataset.engine_here().start_broker()
        it = iter(self.dataset) if direct else iter(self._loader)
        watch = (
            WorkerWatch(it, self.timeout)
            if self._loader.num_workers > 0 and self.timeout > 0
            else None
        )
        try:
            for batch in self._feeder(it if watch is None else iter(watch)):
                self._done += 1
                yield batch
        except (
            RuntimeError,
            OSError,
            EOFError,
        ) as e:  # after a kill: SIGCHLD's RuntimeError, or EOF on a fetch
            timeout = None if watch is None else watch.timed_out(e)
            if timeout is None:
                raise
            self._loader._iterator = (
                None  # persistent workers are gone too: the next epoch starts new ones
            )
            raise timeout from e
        finally:
            # An error or an early ``break`` leaves torch's iterator in a reference cycle (via the
            # traceback); its workers would idle until the garbage collector and a 5 s join timeout
            # per worker. Shut them down now. Persistent workers are kept for the next epoch.
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None and not self._loader.persistent_workers:
                shutdown()
            close = getattr(it, "close", None)  # the dataset's generator: stop its threads now
            if close is not None:
                close()

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON: the epoch, the batches handed out, and what decides the order.
        ``world_size``, ``rank`` and ``batch_size`` are informational: the state loads on any
        world with the same ``global_batch`` (:meth:`load_state_dict`)."""
        ds = self.dataset
        k, offset, base = self._layout or ds.layout(self._epoch)
        return seal(
            {
                "version": STATE_VERSION,
                "epoch": self._epoch,
                "batches_done": self._done,
                "rank": ds.rank,
                "num_batches": len(self),
                "world_size": ds.world_size,
                "batch_size": ds.batch_size,
                "seed": ds.seed,
                "sample": ds.sample,
                "split": ds.split,
                "window": ds.window,
                "shuffle": ds.shuffle,
                "pad": ds.pad,
                "drop_last": ds.drop_last,
                "units": ds.n_units,
                "sample_config": ds.sample_type.order_config(),
                "dataset": ds.fingerprint,
                "partitions": k,
                "global_batch": ds.global_batch,
                "offset": offset,
                "offset_step": base,
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume mid-epoch, on this world or another one; raises ValueError when the state belongs
        to a different order (see module doc).

        The rest of the epoch keeps the state's canonical partitions (:mod:`loaders.epoch.elastic`):
        fixed-size batches continue at the state's global batch, split among this world's ranks;
        budget batches continue at the first canonical batch not yet served, dealt round-robin
        to this world's ranks (their per-rank count changes with the world size)."""
        ds = self.dataset
        done = check_state(state, self.state_dict(), ds.budgeted)
        epoch = int(state["epoch"])
        plan_size = (lambda k: ds.plan.plan_size(epoch, k)) if ds.budgeted else None
        check_layout(
            state, EpochFacts(ds.n_units, ds.global_batch, ds.pad, ds.drop_last, plan_size)
        )
        check_digest(state)
        k, _, offset, base = layout_of(state)
        if ds.budgeted and state["world_size"] != ds.world_size and done >= base:
            # the canonical batches served so far; the steps keep their numbers from ``done`` on
            offset, base = offset + (done - base) * state["world_size"], done
        layout = (k, offset, base)
        ds.plan.set_iteration(epoch, done, layout)
        try:
            check_done(done, ds.num_batches(epoch))
        except ValueError:
            ds.plan.set_iteration(self._epoch, self._resume or 0, self._layout)
            raise
        self._epoch, self._done, self._resume, self._layout = epoch, done, done, layout
