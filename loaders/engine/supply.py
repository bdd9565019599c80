"""Where a ShardDataset's windows come from: a live window of this process, the decoder process, the
training process's broker (in a DataLoader worker), or a decode right here; and the shards
skipped on the way.

A mixin of :class:`~loaders.dataset.ShardDataset` (it reads the dataset's reader, order
parameters and per-process state), kept apart because getting a window decoded once and shared is
one concern and turning windows into batches (the dataset's iteration) is another.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from loaders import order
from loaders.engine.arena import Arena, BufferPool
from loaders.engine.broker import Broker, BrokerClient, BrokerError
from loaders.engine.decoder import Decoder
from loaders.engine.live import LiveWindows
from loaders.engine.slab import DecoderError
from loaders.engine.window import WindowReader
from loaders.remote import ahead
from loaders.remote.resolve import node_cache


def _recycler(supply: weakref.ref[WindowSupply]) -> Callable[[Arena], None]:
    """What a live window does with its buffers once no batch uses it: back to the dataset's pool.
    Through a weak reference: a closure over the dataset itself, held by its own registry, is a
    reference cycle, and a dropped dataset (and its decoder process) would live on until the
    cyclic garbage collector happened to run."""

    def recycle(arena: Arena) -> None:
        owner = supply()
        if owner is not None:
            arena.release(owner.buffers())

    return recycle


class WindowSupply:
    """Windows for one dataset in one process (see module docstring)."""

    root: Path
    reader: WindowReader
    counts: np.ndarray
    entries: list[Any]
    seed: int
    window: int
    shuffle: bool
    decode_process: bool
    decoder_threads: int
    decode_timeout: float
    _pool: BufferPool | None
    _live: LiveWindows | None
    _ahead_lock: threading.Lock
    _decoder_state: tuple[int, Decoder] | None
    _broker: Broker | None
    _broker_address: str | None
    _broker_pid: int
    _broker_client: BrokerClient | None
    _skipped: dict[int, str]
    _skip_flags: Any

    def buffers(self) -> BufferPool:
        """This process's recycled window buffers (kept across epochs; bounded by BufferPool.keep)."""
        if self._pool is None or self._pool.pid != os.getpid():
            self._pool = BufferPool()
        return self._pool

    def read_window(self, epoch: int, w: int, pool: Executor | None = None) -> Arena:
        """Window ``w`` of ``epoch``: a view of a live window of the same shards if this process
        holds one (the next epoch's first window while the last is served: with ``window >=
        n_shards`` every epoch is one window of the same shards, so the split is decoded once,
        not once per epoch), else decoded."""
        remote = self.reader.spec.get("remote")
        if remote:  # a URL dataset: this window pinned, the next ones downloading meanwhile
            ahead.prefetch(self, node_cache(remote, self.reader.spec["root"]), epoch, w)
        live = self.live_windows()
        key = tuple(sorted(self.reader.window_shards(epoch, w).tolist()))
        entry = live.claim(key)
        if entry is not None:
            wu = order.window_units(self.counts, self.seed, epoch, self.window, w, self.shuffle)
            return live.view(key, entry, entry[0].order_of(*wu))  # type: ignore[attr-defined]
        arena = self._decode_window(epoch, w, pool)
        return live.view(key, live.add(key, arena), arena.order)

    def live_windows(self) -> LiveWindows:
        """This process's registry of decoded windows still served (a fork starts its own)."""
        if self._live is None or self._live.pid != os.getpid():
            self._live = LiveWindows(_recycler(weakref.ref(self)))
        return self._live

    def _decode_window(self, epoch: int, w: int, pool: Executor | None = None) -> Arena:
        """Window ``w`` of ``epoch``, decoded and checked (errors name the shard), sealed as one CSR
        matrix: by the decoder process once it is up, else here (shards in parallel on ``pool``)."""
        # a split of one window is decoded once, then served live to every later epoch: a
        # decoder process would start (~0.45 CPU-s) only to sit idle, competing with this decode
        # (and a cold cache's downloads); one already up (DataLoader workers' broker) is used
        several = order.window_count(len(self.reader.entries), self.window) > 1
        decoder, arena = self._decoder(start=several), None
        if self._broker_address is not None and get_worker_info() is not None:
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
            self.decode_process = False
            decoder.close()  # type: ignore[union-attr]
        if arena is None:
            arena = self.reader.read_window(epoch, w, self.buffers(), pool)
        if arena.skipped:
            self._note_skipped(arena.skipped)
        arena.seal()
        return arena

    def start_broker(self) -> None:
        """Before DataLoader workers start: they will get their windows from this process's decoder
        process, each decoded once for all of them (:mod:`loaders.engine.broker`), instead of
        decoding every window each."""
        if (
            get_worker_info() is not None
            or self._broker_address is not None
            and self._broker_pid == os.getpid()
        ):
            return
        dec = self._decoder()
        if dec is None:
            return
        # the size hint reads the reader, never the dataset: the broker's thread keeps the broker
        # alive, and a broker holding the dataset would keep it (and its decoder) alive for good
        reader = self.reader
        b = Broker(dec, lambda e, w: int(reader.raw_bytes(e, w) * 1.1) + (1 << 20))
        weakref.finalize(self, b.close)
        self._broker, self._broker_address, self._broker_pid = b, b.address, os.getpid()

    def _from_broker(self, epoch: int, w: int) -> Arena | None:
        """Window ``w`` of ``epoch`` from the training process's broker (a worker), or None: it went
        away."""
        try:
            if self._broker_client is None or self._broker_client.pid != os.getpid():
                self._broker_client = BrokerClient(self._broker_address)  # type: ignore[arg-type]
            return self._broker_client.read_window(epoch, w)
        except BrokerError as e:
            warnings.warn(
                f"{e}; {self.root}: this worker decodes its windows itself from now on",
                RuntimeWarning,
                stacklevel=3,
            )
            self._broker_address = None
            return None

    def _note_skipped(self, skipped: list[list[Any]]) -> None:
        for s, why in skipped:
            if int(s) not in self._skipped:
                warnings.warn(f"on_corrupt='skip': skipping {why}", RuntimeWarning, stacklevel=3)
            self._skipped[int(s)] = str(why)
            if self._skip_flags is not None:
                self._skip_flags[int(s)] = 1

    @property
    def skipped_shards(self) -> list[str]:
        """Files of the shards skipped so far (``on_corrupt="skip"``), by this process and its
        DataLoader workers; their units were left out of their batches."""
        ids = set(self._skipped)
        if self._skip_flags is not None:
            ids.update(i for i, f in enumerate(self._skip_flags) if f)
        return [self.entries[i].file for i in sorted(ids)]

    def _decoder(self, start: bool = True) -> Decoder | None:
        """This process's decoder process (started on first use, unless not `start`), if decoding
        runs in one here."""
        if not self.decode_process or get_worker_info() is not None:
            return None
        with self._ahead_lock:
            if self._decoder_state is None or self._decoder_state[0] != os.getpid():
                if not start:
                    return None
                dec = Decoder(self.reader.spec, self.decoder_threads, timeout=self.decode_timeout)
                weakref.finalize(self, dec.close)
                self._decoder_state = (os.getpid(), dec)
        return self._decoder_state[1]
