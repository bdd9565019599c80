"""One process's machinery for one :class:`~loaders.dataset.ShardDataset`, and what a
:class:`~loaders.loader.ShardLoader` tells the dataset (:class:`LoaderSettings`).

Why one object made per process: a dataset crosses into DataLoader workers (forked or pickled),
and what it holds must cross too; threads, a pool of buffers, the decoder process, the broker or
its connection and the windows decoded so far belong to the process that made them. So the
dataset keeps its spec and epoch plan (plain values) and one :class:`PerProcess` slot, which
comes back empty in any other process; the first use in a process makes its
:class:`ProcessEngine`.

What the engine does, in that process: windows come from a live window of the same shards, the
decoder process (the training process), the broker (a DataLoader worker) or a decode right here;
shards skipped on the way are noted; and windows become batches: the batches a worker serves
requested window by window (:class:`~loaders.epoch.schedule.WindowSchedule`), the next window
decoded meanwhile and, at an epoch's last window, the next epoch's first one, the windows behind
recycled, batches assembled ``batches_ahead`` ahead in a thread, each by the sample type from the
windows' arenas (:meth:`ProcessEngine.make_batch`).
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import numpy as np
from torch.utils.data import get_worker_info

from loaders.engine.broker import Broker, BrokerClient, BrokerError
from loaders.engine.decoder import Decoder
from loaders.engine.device import prefetch
from loaders.engine.live import LiveWindows
from loaders.engine.slab import DecoderError
from loaders.engine.transport import RunShipping, staging_buffer, to_shared, to_tensors
from loaders.epoch import order
from loaders.epoch.schedule import Plan, Segment, WindowSchedule
from loaders.remote import ahead
from loaders.remote.resolve import node_cache
from loaders.remote.threads import DaemonExecutor
from loaders.samples.arena import Arena, BufferPool
from loaders.samples.gather import BatchRows
from loaders.samples.payload import Payload

T = TypeVar("T")


@dataclass(frozen=True)
class LoaderSettings:
    """What a :class:`~loaders.loader.ShardLoader` tells its dataset, in one object
    (:meth:`~loaders.dataset.ShardDataset.configure`; a plain dataset uses the defaults).

    ``output``: ``"dense"`` (deferred items finished where the batch is made) or ``"positions"``
    (their parts, finished on a device); ``staging``: main-process batches for a device as one
    buffer (pinned if True), None: tensors; ``shipping``: how workers ship runs of batches (None:
    a plain DataLoader's dicts); ``timeout``: the loader's bound in seconds (0: none), which also
    caps the decoder process's silence; ``partitions``: canonical partitions K (None: the world
    size); ``shared``: the epoch's slots persistent workers read
    (:data:`~loaders.epoch.layout.SHARED_SLOTS`); ``skip_flags``: one int8 per shard that workers
    set when they skip it."""

    output: str = "dense"
    staging: bool | None = None
    shipping: RunShipping | None = None
    timeout: float = 0.0
    partitions: int | None = None
    shared: Any = None
    skip_flags: Any = None


class PerProcess(Generic[T]):
    """A slot holding one process's object: another process (a fork, or an unpickled copy) finds
    it empty and makes its own; ``make`` gets the object of the process it came from (or None).
    A forked child keeps its parent's object unused: dropped there, its finalizers would close
    the parent's decoder process and broker from the child."""

    def __init__(self) -> None:
        self.pid, self.value, self.parents = 0, None, []

    def get(self, make: Callable[[T | None], T]) -> T:
        if self.pid != os.getpid():
            if self.value is not None:
                self.parents.append(self.value)
            self.value, self.pid = make(self.value), os.getpid()
        return self.value  # type: ignore[return-value]

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return PerProcess, ()


def _recycle(owner: weakref.ref[ProcessEngine], fut: Future[Arena]) -> None:
    """A decoded window's buffers back to its engine's pool (if the engine still lives)."""
    me = owner()
    if me is not None and not fut.cancelled() and fut.exception() is None:
        fut.result().release(me.buffers())


def _release_all(
    owner: weakref.ref[ProcessEngine], held: list[Future[Arena]], _done: Future[Arena]
) -> None:
    me = owner()
    if me is not None:
        for fut in held:
            me.release(fut)


def _recycler(owner: weakref.ref[ProcessEngine]) -> Callable[[Arena], None]:
    """What a live window does with its buffers once no batch uses it: back to the pool."""

    def recycle(arena: Arena) -> None:
        me = owner()
        if me is not None:
            arena.release(me.buffers())

    return recycle


class ProcessEngine:
    """Windows and batches of one dataset in one process (see module docstring). It reaches its
    dataset weakly: callbacks on window futures and the decoder's finalizer hold the engine, and a
    strong reference back would keep a dropped dataset (and its decoder process) alive until the
    cyclic garbage collector happened to run."""

    def __init__(self, ds: Any, parent: ProcessEngine | None = None) -> None:
        self.pid = os.getpid()
        self._ds = weakref.ref(ds)
        self.reader, self.plan, self.root = ds.reader, ds.plan, ds.root
        self.pool: BufferPool | None = None
        self.threads: tuple[Executor | None, Executor | None] | None = None
        self.ahead: tuple[tuple[int, int], Future[Arena]] | None = None  # ((epoch, w), decode)
        self.ahead_lock = threading.Lock()
        self.decoder_state: Decoder | None = None
        self.live = LiveWindows(_recycler(weakref.ref(self)))
        self.broker: Broker | None = None  # the training process's, when workers share its decode
        # a forked worker keeps the address of the broker its parent started
        self.broker_address = None if parent is None else parent.broker_address
        self.broker_client: BrokerClient | None = None

    @property
    def ds(self) -> Any:
        ds = self._ds()
        if ds is None:
            raise ReferenceError("the dataset of this engine was dropped")
        return ds

    # -- where a window comes from ---------------------------------------------------------------
    def buffers(self) -> BufferPool:
        """This process's recycled window buffers (kept across epochs; bounded by BufferPool.keep)."""
        if self.pool is None:
            self.pool = BufferPool()
        return self.pool

    def read_window(self, epoch: int, w: int, pool: Executor | None = None) -> Arena:
        """Window ``w`` of ``epoch``: a view of a live window of the same shards if this process
        holds one (the next epoch's first window while the last is served: with ``window >=
        n_shards`` every epoch is one window of the same shards, so the split is decoded once,
        not once per epoch), else decoded."""
        ds = self.ds
        remote = self.reader.spec.get("remote")
        if remote:  # a URL dataset: this window pinned, the next ones downloading meanwhile
            ahead.prefetch(ds, node_cache(remote, self.reader.spec["root"]), epoch, w)
        key = tuple(sorted(self.reader.window_shards(epoch, w).tolist()))
        entry = self.live.claim(key)
        if entry is not None:
            wu = order.window_units(ds.counts, ds.seed, epoch, ds.window, w, ds.shuffle)
            return self.live.view(key, entry, entry[0].order_of(*wu))  # type: ignore[attr-defined]
        arena = self.decode_window(epoch, w, pool)
        return self.live.view(key, self.live.add(key, arena), arena.order)

    def decode_window(self, epoch: int, w: int, pool: Executor | None = None) -> Arena:
        """Window ``w`` of ``epoch``, decoded and checked (errors name the shard), sealed as one CSR
        matrix: by the decoder process once it is up, else here (shards in parallel on ``pool``)."""
        # a split of one window is decoded once, then served live to every later epoch: a
        # decoder process would start (~0.45 CPU-s) only to sit idle, competing with this decode
        # (and a cold cache's downloads); one already up (DataLoader workers' broker) is used
        ds = self.ds
        several = order.window_count(len(self.reader.entries), ds.window) > 1
        decoder, arena = self.decoder(start=several), None
        if self.broker_address is not None and get_worker_info() is not None:
            arena = self._from_broker(epoch, w)
        try:
            if arena is None and decoder is not None and decoder.ready():
                arena = decoder.read_window(
                    epoch, w, int(self.reader.raw_bytes(epoch, w) * 1.1) + (1 << 20)
                )
                # what the first, in-process windows used is not needed any more
                self.buffers().clear()
        except DecoderError as e:  # the process died or could not start: go on without it, loudly
            warnings.warn(
                f"{e}; {self.root}: decoding in the training process from now on",
                RuntimeWarning,
                stacklevel=2,
            )
            ds.decode_process = False
            decoder.close()  # type: ignore[union-attr]
        if arena is None:
            arena = self.reader.read_window(epoch, w, self.buffers(), pool)
        if arena.skipped:
            ds.note_skipped(arena.skipped)
        arena.seal()
        return arena

    def start_broker(self) -> None:
        """Before DataLoader workers start: they will get their windows from this process's decoder
        process, each decoded once for all of them (:mod:`loaders.engine.broker`), instead of
        decoding every window each."""
        if get_worker_info() is not None or self.broker is not None:
            return
        dec = self.decoder()
        if dec is None:
            return
        # the size hint reads the reader, never the dataset: the broker's thread keeps the broker
        # alive, and a broker holding the dataset would keep it (and its decoder) alive for good
        reader = self.reader
        b = Broker(dec, lambda e, w: int(reader.raw_bytes(e, w) * 1.1) + (1 << 20))
        weakref.finalize(self, b.close)
        self.broker, self.broker_address = b, b.address

    def _from_broker(self, epoch: int, w: int) -> Arena | None:
        """Window ``w`` of ``epoch`` from the training process's broker (a worker), or None: it went
        away."""
        try:
            if self.broker_client is None:
                self.broker_client = BrokerClient(self.broker_address)  # type: ignore[arg-type]
            return self.broker_client.read_window(epoch, w)
        except BrokerError as e:
            warnings.warn(
                f"{e}; {self.root}: this worker decodes its windows itself from now on",
                RuntimeWarning,
                stacklevel=3,
            )
            self.broker_address = None
            return None

    def decoder(self, start: bool = True) -> Decoder | None:
        """This process's decoder process (started on first use, unless not `start`), if decoding
        runs in one here."""
        ds = self.ds
        if not ds.decode_process or get_worker_info() is not None:
            return None
        with self.ahead_lock:
            if self.decoder_state is None:
                if not start:
                    return None
                dec = Decoder(self.reader.spec, ds.decoder_threads, timeout=ds.decode_timeout)
                weakref.finalize(self, dec.close)
                self.decoder_state = dec
        return self.decoder_state

    # -- windows into batches --------------------------------------------------------------------
    def serve(
        self, epoch: int, batches: Iterable[int], worker: int, n_workers: int
    ) -> Iterator[Any]:
        """Batches assembled ``batches_ahead`` ahead in a thread: numpy's take and scipy's row
        kernels release the GIL, so with ``num_workers=0`` the training thread only waits on a
        queue."""
        n = self.ds.batches_ahead
        if n == 0:
            return self._produce(epoch, batches, worker, n_workers)
        return prefetch(
            lambda: self._produce(epoch, batches, worker, n_workers), n, "shard-assemble"
        )

    def executors(self) -> tuple[Executor | None, Executor | None]:
        """This process's (window, shard) decode threads; they outlive an epoch so that the next
        epoch's first window can be decoded while this epoch's last one is served."""
        if self.threads is None:
            ds = self.ds
            window = (
                DaemonExecutor(1, "shard-window")
                if ds.decode_ahead
                else None
            )
            shard = (
                DaemonExecutor(ds.decode_threads, "shard-decode")
                if ds.decode_threads > 1 and ds.window > 1
                else None
            )
            self.threads = (window, shard)
            for ex in (window, shard):  # idle threads end with the engine, not at interpreter exit
                if ex is not None:
                    weakref.finalize(self, ex.shutdown, wait=False, cancel_futures=True)
        return self.threads

    def release(self, fut: Future[Arena]) -> None:
        """Recycle a window's buffers once nothing decodes into them (a running decode is left to
        finish)."""
        if not fut.cancel():
            fut.add_done_callback(partial(_recycle, weakref.ref(self)))

    def _speculate(self, epoch: int, worker: int, n_workers: int) -> None:
        """Start decoding ``epoch``'s first window of this worker (the usual next epoch) in the
        background. Only where the process lives on (the main process, persistent workers); a
        mismatch is just dropped."""
        window_pool, shard_pool = self.executors()
        ds = self.ds
        if window_pool is None or (get_worker_info() is not None and self.plan.shared is None):
            return
        first = order.worker_runs(self.plan.num_batches(epoch), worker, n_workers, 0, ds.group())
        if not len(first):
            return
        wstarts = order.window_bounds(ds.counts, ds.seed, epoch, ds.window, ds.shuffle)[1]
        w = self.plan.plans(epoch, wstarts)(first[0][0])[1][0]
        with self.ahead_lock:
            old, self.ahead = (
                self.ahead,
                ((epoch, w), window_pool.submit(self.read_window, epoch, w, shard_pool)),
            )
        if old is not None:
            self.release(old[1])

    def _adopt(self, epoch: int) -> dict[int, Future[Arena]]:
        """The speculative decode of ``epoch``'s first window, if one was started (else it is
        dropped)."""
        with self.ahead_lock:
            started, self.ahead = self.ahead, None
        if started is None:
            return {}
        if started[0][0] == epoch:
            return {started[0][1]: started[1]}
        self.release(started[1])
        return {}

    def _produce(
        self, epoch: int, batches: Iterable[int], worker: int, n_workers: int
    ) -> Iterator[Any]:
        """Batches in order: tensors in the main process, payloads in a worker (its caller ships
        runs of them)."""
        ds = self.ds
        settings = ds.settings
        wstarts = order.window_bounds(ds.counts, ds.seed, epoch, ds.window, ds.shuffle)[1]
        in_worker = get_worker_info() is not None
        plan_of: Callable[[int], Plan] = self.plan.plans(epoch, wstarts)
        window_pool, shard_pool = self.executors()
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
                elif upcoming is None and not speculated:  # the last window: the next epoch's first
                    self._speculate(epoch + 1, worker, n_workers)
                    speculated = True
                for w in [w for w in loaded if w not in keep]:
                    self.release(loaded.pop(w))  # windows behind us: recycle their memory
                arenas = {w: loaded[w].result() for w in wins}
                payload = self.make_batch(arenas, segments, epoch)
                if in_worker:
                    yield payload
                elif settings.staging is None:
                    yield to_tensors(payload, settings.output)
                else:  # for a device: one (pinned) buffer, one host-to-device copy (engine/device.py)
                    alloc = partial(staging_buffer, pinned=settings.staging)
                    yield to_shared([payload], settings.output, alloc=alloc)
        finally:
            # windows still held go back once the next epoch's first window is read (it may be a
            # view of one of them: released first, it would be decoded again)
            held, started = list(loaded.values()), self.ahead
            loaded.clear()
            if started is not None and not started[1].done():
                started[1].add_done_callback(partial(_release_all, weakref.ref(self), held))
            else:
                for fut in held:
                    self.release(fut)

    def make_batch(
        self, arenas: dict[int, Arena], segments: list[Segment], epoch: int | None = None
    ) -> Payload:
        """The batch of the units at positions ``[lo, hi)`` of windows ``w`` for each ``(w, lo,
        hi)`` in ``segments`` (in batch order), whose arenas are ``arenas``, assembled by the
        sample type."""
        epoch = self.plan.iteration()[0] if epoch is None else epoch
        sample_type, seed = self.plan.sample_type, self.plan.seed
        if len(segments) == 1:  # the common case, kept lean: a batch costs ~100 us
            w, lo, hi = segments[0]
            a = arenas[w]
            pick = a.order[lo:hi]
            if a.skipped:  # units of skipped shards (on_corrupt="skip") are left out
                pick = pick[pick >= 0]
            return sample_type.assemble(
                BatchRows([a], None, a.units.take(pick, axis=0), a.unit_ids.take(pick), seed, epoch)
            )
        keys = sorted(arenas)
        arena_list = [arenas[w] for w in keys]
        # a loop over (at most a few) segments, never over units
        picks = [arenas[w].order[lo:hi] for w, lo, hi in segments]
        picks = [
            p[p >= 0] if arenas[w].skipped else p
            for (w, _, _), p in zip(segments, picks, strict=True)
        ]
        picked = list(zip(segments, picks, strict=True))
        units = [np.take(arenas[w].units, pick, axis=0) for (w, _, _), pick in picked]
        ids = [np.take(arenas[w].unit_ids, pick) for (w, _, _), pick in picked]
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
            seed,
            epoch,
        )
        return sample_type.assemble(batch)
