"""How a :class:`~loaders.dataset.ShardDataset` turns windows into batches in one process: the
batches it serves requested window by window (:class:`~loaders.engine.schedule.WindowSchedule`),
the next window decoded meanwhile and, at an epoch's last window, the next epoch's first one, the
windows behind recycled, batches assembled ``batches_ahead`` ahead in a thread, and each batch
assembled by the sample type from the windows' arenas (:meth:`BatchProduction.make_batch`).

A mixin of :class:`~loaders.dataset.ShardDataset`, like :class:`~loaders.engine.supply.WindowSupply`:
where a window comes from is that mixin's concern, what a dataset is (its index, sample type,
options, this rank's batch plan, and how ``__iter__`` splits batches among DataLoader workers) the
dataset's; what is left, keeping windows flowing into batches in one process, is this module. From
the dataset it uses ``read_window`` and ``buffers`` (``WindowSupply``), ``_plans``,
``num_batches``, ``_group`` and ``_iteration``.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from functools import partial
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from loaders import order
from loaders.collate import Arena, Payload, staging_buffer, to_shared, to_tensors
from loaders.device import prefetch
from loaders.engine.daemon import DaemonExecutor
from loaders.engine.schedule import Plan, Segment, WindowSchedule
from loaders.gather import BatchRows


# Callbacks on window futures reach their dataset weakly: the dataset keeps some of these futures
# (its speculative decode of the next epoch's first window), and a future keeps its callbacks, so
# a strong reference would be a cycle holding a dropped dataset (and its decoder process) until the
# cyclic garbage collector happened to run.
def _recycle(owner: weakref.ref[Any], fut: Future[Arena]) -> None:
    """A decoded window's buffers back to its dataset's pool (if the dataset still lives)."""
    me = owner()
    if me is not None and not fut.cancelled() and fut.exception() is None:
        fut.result().release(me.buffers())


def _release_all(owner: weakref.ref[Any], held: list[Future[Arena]], _done: Future[Arena]) -> None:
    me = owner()
    if me is not None:
        for fut in held:
            me._release(fut)


class BatchProduction:
    """Batches of windows in one process (see module docstring)."""

    sample_type: Any
    seed: int
    counts: np.ndarray
    window: int
    shuffle: bool
    decode_ahead: bool
    decode_threads: int
    batches_ahead: int
    output: str
    staging: bool | None
    _threads: tuple[int, Executor | None, Executor | None] | None
    _ahead: tuple[tuple[int, int], Future[Arena]] | None
    _ahead_lock: threading.Lock
    _shared: Any

    def _serve(
        self, epoch: int, batches: Iterable[int], worker: int, n_workers: int
    ) -> Iterator[Any]:
        """Batches assembled ``batches_ahead`` ahead in a thread: numpy's take and scipy's row
        kernels release the GIL, so with ``num_workers=0`` the training thread only waits on a
        queue."""
        if self.batches_ahead == 0:
            return self._produce(epoch, batches, worker, n_workers)
        return prefetch(
            lambda: self._produce(epoch, batches, worker, n_workers),
            self.batches_ahead,
            "shard-assemble",
        )

    def _executors(self) -> tuple[Executor | None, Executor | None]:
        """This process's (window, shard) decode threads; they outlive an epoch so that the next
        epoch's first window can be decoded while this epoch's last one is served."""
        if self._threads is None or self._threads[0] != os.getpid():
            window = (
                DaemonExecutor(1, "shard-window")
                if self.decode_ahead
                else None
            )
            shard = (
                DaemonExecutor(self.decode_threads, "shard-decode")
                if self.decode_threads > 1 and self.window > 1
                else None
            )
            self._threads, self._ahead, self._ahead_lock = (
                (os.getpid(), window, shard),
                None,
                threading.Lock(),
            )
            for ex in (
                window,
                shard,
            ):  # idle threads end with the dataset, not only at interpreter exit
                if ex is not None:
                    weakref.finalize(self, ex.shutdown, wait=False, cancel_futures=True)
        return self._threads[1], self._threads[2]

    def _release(self, fut: Future[Arena]) -> None:
        """Recycle a window's buffers once nothing decodes into them (a running decode is left to
        finish)."""
        if not fut.cancel():
            fut.add_done_callback(partial(_recycle, weakref.ref(self)))

    def _speculate(self, epoch: int, worker: int, n_workers: int) -> None:
        """Start decoding ``epoch``'s first window of this worker (the usual next epoch) in the
        background. Only where the process lives on (the main process, persistent workers); a
        mismatch is just dropped."""
        window_pool, shard_pool = self._executors()
        if window_pool is None or (get_worker_info() is not None and self._shared is None):
            return
        first = order.worker_runs(self.num_batches(epoch), worker, n_workers, 0, self._group())
        if not len(first):
            return
        wstarts = order.window_bounds(self.counts, self.seed, epoch, self.window, self.shuffle)[1]
        w = self._plans(epoch, wstarts)(first[0][0])[1][0]
        with self._ahead_lock:
            old, self._ahead = (
                self._ahead,
                ((epoch, w), window_pool.submit(self.read_window, epoch, w, shard_pool)),
            )
        if old is not None:
            self._release(old[1])

    def _adopt(self, epoch: int) -> dict[int, Future[Arena]]:
        """The speculative decode of ``epoch``'s first window, if one was started (else it is
        dropped)."""
        with self._ahead_lock:
            ahead, self._ahead = self._ahead, None
        if ahead is None:
            return {}
        if ahead[0][0] == epoch:
            return {ahead[0][1]: ahead[1]}
        self._release(ahead[1])
        return {}

    def _produce(
        self, epoch: int, batches: Iterable[int], worker: int, n_workers: int
    ) -> Iterator[Any]:
        """Batches in order: tensors in the main process, payloads in a worker (its caller ships
        runs of them)."""
        wstarts = order.window_bounds(self.counts, self.seed, epoch, self.window, self.shuffle)[1]
        in_worker = get_worker_info() is not None
        plan_of: Callable[[int], Plan] = self._plans(epoch, wstarts)
        window_pool, shard_pool = self._executors()
        loaded = self._adopt(epoch)
        schedule = WindowSchedule(plan_of(j) for j in batches)
        speculated = False

        def request(w: int) -> None:
            if w not in loaded:
                if window_pool is None:
                    loaded[w] = Future()
                    loaded[w].set_result(self.read_window(epoch, w, shard_pool))
                else:
                    loaded[w] = window_pool.submit(self.read_window, epoch, w, shard_pool)

        try:
            while (plan := schedule.next_plan()) is not None:
                segments, wins = plan
                for w in wins:
                    request(w)
                keep, upcoming = set(wins), schedule.next_window
                if upcoming is not None and window_pool is not None:
                    request(upcoming)  # the next window this worker will touch: decode it meanwhile
                    keep.add(upcoming)
                elif (
                    upcoming is None and not speculated
                ):  # serving the last window: the next epoch's first
                    self._speculate(epoch + 1, worker, n_workers)
                    speculated = True
                for w in [w for w in loaded if w not in keep]:
                    self._release(loaded.pop(w))  # windows behind us: recycle their memory
                arenas = {w: loaded[w].result() for w in wins}
                payload = self.make_batch(arenas, segments, epoch)
                if in_worker:
                    yield payload
                elif self.staging is None:
                    yield to_tensors(payload, self.output)
                else:  # for a device: one (pinned) buffer, one host-to-device copy (loaders.device)
                    yield to_shared(
                        [payload], self.output, alloc=partial(staging_buffer, pinned=self.staging)
                    )
        finally:
            # windows still held go back once the next epoch's first window is read (it may be a
            # view of one of them: released first, it would be decoded again)
            held, ahead = list(loaded.values()), self._ahead
            loaded.clear()
            if ahead is not None and not ahead[1].done():
                ahead[1].add_done_callback(partial(_release_all, weakref.ref(self), held))
            else:
                for fut in held:
                    self._release(fut)

    def make_batch(
        self, arenas: dict[int, Arena], segments: list[Segment], epoch: int | None = None
    ) -> Payload:
        """The batch of the units at positions ``[lo, hi)`` of windows ``w`` for each ``(w, lo,
        hi)`` in ``segments`` (in batch order), whose arenas are ``arenas``, assembled by the
        sample type."""
        epoch = self._iteration()[0] if epoch is None else epoch
        if (
            len(segments) == 1
        ):  # the common case, kept lean: a batch costs ~100 us, a list comprehension ~1
            w, lo, hi = segments[0]
            a = arenas[w]
            pick = a.order[lo:hi]
            if a.skipped:  # units of skipped shards (on_corrupt="skip") are left out
                pick = pick[pick >= 0]
            return self.sample_type.assemble(
                BatchRows(
                    [a], None, a.units.take(pick, axis=0), a.unit_ids.take(pick), self.seed, epoch
                )
            )
        keys = sorted(arenas)
        arena_list = [arenas[w] for w in keys]
        # a loop over (at most a few) segments, never over units
        picks = [arenas[w].order[lo:hi] for w, lo, hi in segments]
        picks = [
            p[p >= 0] if arenas[w].skipped else p
            for (w, _, _), p in zip(segments, picks, strict=True)
        ]
        units = [
            np.take(arenas[w].units, pick, axis=0)
            for (w, _, _), pick in zip(segments, picks, strict=True)
        ]
        ids = [
            np.take(arenas[w].unit_ids, pick)
            for (w, _, _), pick in zip(segments, picks, strict=True)
        ]
        group = (
            None
            if len(arena_list) == 1
            else np.repeat([keys.index(w) for w, _, _ in segments], [p.size for p in picks])
        )
        batch = BatchRows(
            arena_list,
            group,
            np.concatenate(units) if len(units) > 1 else units[0],
            np.concatenate(ids) if len(ids) > 1 else ids[0],
            self.seed,
            epoch,
        )
        return self.sample_type.assemble(batch)
