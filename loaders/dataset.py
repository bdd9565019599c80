"""ShardDataset: a torch IterableDataset that yields whole batches from a shardsmith dataset.

Why whole batches: the expensive part of loading single cells is gathering sparse rows; doing it
for 256 rows at once with a few vectorised numpy calls avoids per-sample ``__getitem__`` + collate,
whose Python overhead alone exceeds the whole vectorised gather.

Why windows: a batch mixes the units of ``window`` shards (the shuffle buffer). A window's shards are
decoded once, straight into an :class:`~loaders.collate.Arena` (cells mode then permutes it into the
epoch's order), and it serves every batch that falls in it; the next window a worker will touch is
decoded in a background thread meanwhile (blosc and numpy release the GIL), so decoding overlaps
batch assembly even with ``num_workers=0``. Windows a worker has moved past are recycled through a
per-process buffer pool, so memory is bounded by ~3 windows per worker and does not grow across epochs.

The order (which units, which batch, which worker) is entirely :mod:`loaders.order`.
"""

from __future__ import annotations

import bisect
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loaders import order
from loaders.collate import DATA, INDICES, INDPTR, Arena, BufferPool, Payload, Rows, shard_units, to_shared, to_tensors
from loaders.device import prefetch
from loaders.format import (
    COND_ID,
    OBS_PREFIX,
    OBSM_PREFIX,
    PAIRS,
    PRIMARY,
    SAMPLE_ID,
    SENTENCES_CTRL,
    SENTENCES_PERT,
    FormatError,
    ShardEntry,
    X,
    read_index,
    validate_columns,
)
from loaders.shardio import Column, open_shard, read_shard

SAMPLES = ("cells", "pairs", "sentences")
Segment = tuple[int, int, int]  # (window, first position in it, end position)
MAX_LOOKAHEAD = 4096  # batches planned ahead while looking for the next window to decode


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ShardDataset(IterableDataset):
    """Batches of one split of a dataset folder (``index.json`` + ``shards/``).

    ``sample``: "cells" (primary cells), "pairs" (control, perturbed) or "sentences" (rows of L
    cells of one group with matched controls). ``rank``/``world_size`` default to torch.distributed's
    when it is initialised. ``pad=True`` repeats units so every rank gets ceil(N/world) of them;
    ``pad=False`` drops the last N mod world. Use it through :class:`~loaders.loader.ShardLoader`
    (which sets epochs and resume offsets) or a ``DataLoader(ds, batch_size=None)``.
    """

    def __init__(self, root: str | Path, split: str = "train", sample: str = "cells", batch_size: int = 256,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, pad: bool = True, window: int = 4,
                 densify: bool = True, rank: int | None = None, world_size: int | None = None,
                 decode_ahead: bool = True, batches_ahead: int = 2, decode_threads: int | None = None) -> None:
        super().__init__()
        self.root = Path(root)
        index = read_index(self.root)
        present = sorted({s.split for s in index.shards})
        if split not in present:
            raise ValueError(f"unknown split {split!r} for {self.root} (valid: {present})")
        if sample not in SAMPLES:
            raise ValueError(f"unknown sample {sample!r} (valid: {list(SAMPLES)})")
        needs = {"pairs": [PAIRS], "sentences": [SENTENCES_PERT, SENTENCES_CTRL]}.get(sample, [])
        missing = [t for t in needs if t not in index.tables]
        if missing:
            raise ValueError(f"sample={sample!r} needs tables {missing}, which {self.root} does not have")
        if batch_size < 1 or window < 1 or seed < 0:
            raise ValueError("batch_size and window must be >= 1 and seed >= 0")
        d_rank, d_world = _dist_rank_world()
        self.rank = d_rank if rank is None else int(rank)
        self.world_size = d_world if world_size is None else int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside [0, {self.world_size})")
        self.split, self.sample, self.batch_size, self.shuffle, self.seed = split, sample, batch_size, shuffle, seed
        self.drop_last, self.pad, self.window, self.densify = drop_last, pad, window, densify
        self.decode_ahead, self.batches_ahead = decode_ahead, max(0, int(batches_ahead))
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.decode_threads = max(1, min(window, cores, 4) if decode_threads is None else int(decode_threads))
        self.output = "dense" if densify else "sparse"  # ShardLoader switches to "parts" to densify on a device

        self.encoding = index.encoding
        self.vocabularies = index.vocabularies  # code -> label per obs field (e.g. to size a classifier)
        self.entries: list[ShardEntry] = index.shards_of(split)
        self.paths = [str(index.shard_path(e)) for e in self.entries]
        self.counts = np.array([getattr(e, "primary" if sample == "cells" else sample) for e in self.entries],
                               dtype=np.int64)
        self.n_cols = index.field(X).shape[0]
        names = [f.name for f in index.fields]
        self.obs_fields = list(index.raw.get("obs_fields") or [n[len(OBS_PREFIX):] for n in names
                                                                if n.startswith(OBS_PREFIX)])
        self.obsm_keys = [n for n in names if n.startswith(OBSM_PREFIX)]
        self.int_keys = [COND_ID] + [OBS_PREFIX + f for f in self.obs_fields]  # one int64 matrix per arena
        self.other_keys = [SAMPLE_ID, *self.obsm_keys]
        self.fields = [index.field(n) for n in [X, SAMPLE_ID, PRIMARY, *self.int_keys, *self.obsm_keys]]
        self.schema = {f.name: f for f in self.fields}
        self.keys = [k for f in self.fields for k in f.keys()] + needs
        self.width = {"cells": 1, "pairs": 2}.get(sample, 0)
        cond = index.conditions
        self.conditions_path = str(self.root / cond["file"]) if cond and cond.get("file") else None
        self._vectors: np.ndarray | None = None
        self._pool: BufferPool | None = None
        self._epoch, self._start = 0, 0
        self._shared: Any = None  # a shared int64 array (epoch, start) when workers are persistent

    # -- sizes and iteration state ---------------------------------------------------------------
    @property
    def n_units(self) -> int:
        """Units of the split (all ranks together)."""
        return int(self.counts.sum())

    def units_per_rank(self) -> int:
        return order.rank_size(self.n_units, self.world_size, self.pad)

    def num_batches(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return order.num_batches(self.units_per_rank(), self.batch_size, self.drop_last)

    def __len__(self) -> int:
        return self.num_batches()

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's order (and start it from its first batch)."""
        self._set_iteration(epoch, 0)

    def _set_iteration(self, epoch: int, start: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0 (got {epoch})")
        self._epoch, self._start = int(epoch), int(start)
        if self._shared is not None:
            self._shared[0], self._shared[1] = self._epoch, self._start

    def _iteration(self) -> tuple[int, int]:
        if self._shared is not None:  # persistent workers: the main process may have moved on since the fork
            return int(self._shared[0]), int(self._shared[1])
        return self._epoch, self._start

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_vectors"] = None  # reloaded lazily in each process; never shipped to workers
        state["_pool"] = None  # buffers belong to one process
        return state

    def buffers(self) -> BufferPool:
        """This process's recycled window buffers (kept across epochs; bounded by BufferPool.keep)."""
        if self._pool is None or self._pool.pid != os.getpid():
            self._pool = BufferPool()
        return self._pool

    # -- decoding --------------------------------------------------------------------------------
    def vectors(self) -> np.ndarray | None:
        if self._vectors is None and self.conditions_path is not None:
            # a zarr group (a folder) per the contract; tar-encoded builds write it in their own encoding
            encoding = "zarr" if Path(self.conditions_path).is_dir() else self.encoding
            try:
                self._vectors = np.asarray(read_shard(self.conditions_path, encoding, ["vectors"])["vectors"],
                                           dtype=np.float32)
            except FormatError as e:
                raise FormatError(f"condition table: {e}") from None
        return self._vectors

    def read_window(self, epoch: int, shard_order: np.ndarray, w: int, pool: ThreadPoolExecutor | None = None
                    ) -> Arena:
        """Decode (shards in parallel on ``pool``) and check the shards of window ``w``; errors name the shard.

        Two passes: the shards' metadata (sizes), then every shard decoded straight into its slice of the
        arena's buffers: no concatenation, no re-encoding. Cells mode then permutes the window into the
        epoch's order (here, off the training thread), so that a batch is a contiguous slice of it."""
        shards = order.window_shards(shard_order, self.window, w).tolist()

        def run(fn: Any, items: list[Any]) -> list[Any]:
            return list(pool.map(fn, items)) if pool is not None and len(items) > 1 else [fn(x) for x in items]

        metas: list[dict[str, Column]] = run(lambda s: open_shard(self.paths[s], self.encoding, self.keys), shards)
        rows = [max(0, m[INDPTR].shape[0] - 1) for m in metas]
        caps = [max(m[INDICES].capacity, m[DATA].capacity) for m in metas]
        other = {k: (np.dtype(self.schema[k].dtype), self.schema[k].shape) for k in self.other_keys}
        buffers = self.buffers()
        arena = Arena.allocate(shards, rows, caps, self.int_keys, other, np.dtype(self.schema[X].dtype), buffers)
        # on an error the buffers are not recycled: other shards of the window may still be decoding into them
        units = run(lambda i: self.fill_shard(arena, i, metas[i]), list(range(len(shards))))
        width = self.width or 2 * next((m[SENTENCES_PERT].shape[1] for m in metas), 0)
        arena.set_units(units, width)
        arena.set_order(*order.window_units(self.counts, self.seed, epoch, self.window, w, self.shuffle))
        if self.sample != "cells":
            return arena
        permuted = arena.permute(buffers, run)
        arena.release(buffers)
        return permuted

    def fill_shard(self, arena: Arena, i: int, columns: dict[str, Column]) -> np.ndarray:
        """Decode shard ``i`` of ``arena`` into its slices, check it, return its units (local rows)."""
        r0, r1 = int(arena.row_offsets[i]), int(arena.row_offsets[i + 1])
        e0, e1 = int(arena.nnz_offsets[i]), int(arena.nnz_offsets[i + 1])
        cols = {INDICES: columns[INDICES].read_into(arena.cols[e0:e1]),
                DATA: columns[DATA].read_into(arena.vals[e0:e1])}
        for k in self.other_keys:
            cols[k] = columns[k].read_into(arena.columns[k][r0:r1])
        cols.update({k: c.read() for k, c in columns.items() if k not in cols})
        self.check_shard(int(arena.shards[i]), cols)
        for j, k in enumerate(self.int_keys):
            arena.ints[j, r0:r1] = cols[k]  # int64: what embeddings and losses index with
        arena.set_rows(i, cols[INDPTR])
        return shard_units(cols, self.sample)

    def check_shard(self, s: int, cols: dict[str, np.ndarray]) -> None:
        path, entry = self.paths[s], self.entries[s]
        n_cond = None if self._vectors is None else self._vectors.shape[0]
        n = validate_columns(cols, self.fields, name=path)
        found = (n, int(np.count_nonzero(cols[PRIMARY])), len(cols.get(PAIRS, ())),
                 len(cols.get(SENTENCES_PERT, ())))
        expected = (entry.records, entry.primary, entry.pairs if PAIRS in cols else 0,
                    entry.sentences if SENTENCES_PERT in cols else 0)
        if found != expected:
            raise FormatError(f"{path}: holds (records, primary, pairs, sentences) = {found}, "
                              f"index.json says {expected}")
        if SENTENCES_PERT in cols and cols[SENTENCES_PERT].shape != cols[SENTENCES_CTRL].shape:
            raise FormatError(f"{path}: sentences/pert and sentences/ctrl differ in shape")
        if n_cond is not None and n and cols[COND_ID].max(initial=0) >= n_cond:
            raise FormatError(f"{path}: cond_id beyond the condition table's {n_cond} rows")

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 0)
        epoch, start = self._iteration()
        batches = order.worker_batches(self.num_batches(), worker, n_workers, start)
        if len(batches):
            self.vectors()
            yield from self._serve(epoch, batches)

    def _serve(self, epoch: int, batches: range) -> Iterator[dict[str, torch.Tensor]]:
        """Batches assembled ``batches_ahead`` ahead in a thread: numpy's take/ufuncs and torch's scatter
        release the GIL, so with ``num_workers=0`` the training thread only waits on a queue."""
        if self.batches_ahead == 0:
            return self._produce(epoch, batches)
        return prefetch(lambda: self._produce(epoch, batches), self.batches_ahead, "shard-assemble")

    def _produce(self, epoch: int, batches: range) -> Iterator[dict[str, Any]]:
        shard_order, wstarts = order.window_bounds(self.counts, self.seed, epoch, self.window, self.shuffle)
        finish = to_shared if get_worker_info() is not None else to_tensors
        bounds, total, per_rank = wstarts.tolist(), self.n_units, self.units_per_rank()
        Plan = tuple[list[Segment], list[int]]  # (segments, windows in order of first use)

        def plan(j: int) -> Plan:
            """Batch j's global positions (``order.batch_positions``) as runs inside one window each:
            ``(k + rank * n) % N`` for rank positions k is contiguous but for the wrap (pad) and window ends."""
            lo = j * self.batch_size
            left, g = min(lo + self.batch_size, per_rank) - lo, (lo + self.rank * per_rank) % max(total, 1)
            segments: list[Segment] = []
            while left > 0:
                w = bisect.bisect_right(bounds, g) - 1
                take = min(left, bounds[w + 1] - g)
                segments.append((w, g - bounds[w], g - bounds[w] + take))
                left, g = left - take, (g + take) % total
            return segments, list(dict.fromkeys(w for w, _, _ in segments))

        pool = ThreadPoolExecutor(1, thread_name_prefix="shard-window") if self.decode_ahead else None
        shard_pool = ThreadPoolExecutor(self.decode_threads, thread_name_prefix="shard-decode") \
            if self.decode_threads > 1 and self.window > 1 else None
        loaded: dict[int, Future[Arena]] = {}

        def request(w: int) -> None:
            if w not in loaded:
                if pool is None:
                    loaded[w] = Future()
                    loaded[w].set_result(self.read_window(epoch, shard_order, w, shard_pool))
                else:
                    loaded[w] = pool.submit(self.read_window, epoch, shard_order, w, shard_pool)

        def release(fut: Future[Arena]) -> None:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().release(self.buffers())

        plans = (plan(j) for j in batches)
        pending: deque[Plan] = deque()
        upcoming: deque[int] = deque()  # windows in order of first use, not yet requested
        seen: set[int] = set()
        exhausted = False

        def look_ahead() -> None:
            nonlocal exhausted
            while not exhausted and (not pending or not upcoming) and len(pending) < MAX_LOOKAHEAD:
                p = next(plans, None)
                if p is None:
                    exhausted = True
                    break
                pending.append(p)
                for w in p[1]:
                    if w not in seen:
                        seen.add(w)
                        upcoming.append(w)

        try:
            while True:
                look_ahead()
                if not pending:
                    return
                segments, wins = pending.popleft()
                for w in wins:
                    request(w)
                while upcoming and upcoming[0] in wins:  # in use now (not merely loaded: a prefetch must be kept)
                    upcoming.popleft()
                look_ahead()
                keep = set(wins)
                if upcoming and pool is not None:
                    request(upcoming[0])  # the next window this worker will touch: decode it meanwhile
                    keep.add(upcoming[0])
                for w in [w for w in loaded if w not in keep]:
                    release(loaded.pop(w))  # windows behind us: recycle their memory
                arenas = {w: loaded[w].result() for w in wins}
                yield finish(self.make_batch(arenas, segments), self.output)
        finally:
            for fut in loaded.values():
                release(fut)
            loaded.clear()
            for p in (pool, shard_pool):
                if p is not None:
                    p.shutdown(wait=False, cancel_futures=True)

    def make_batch(self, arenas: dict[int, Arena], segments: list[Segment]) -> Payload:
        """The batch of the units at positions ``[lo, hi)`` of windows ``w`` for each ``(w, lo, hi)`` in
        ``segments`` (in batch order), whose arenas are ``arenas``."""
        keys = sorted(arenas)
        arena_list = [arenas[w] for w in keys]
        w0, lo0, hi0 = segments[0]
        if len(segments) == 1 and arenas[w0].permuted:  # cells, the common case: a slice, no gather
            urows: np.ndarray | None = None
            b, group = hi0 - lo0, None
        else:  # a loop over (at most a few) segments, never over units
            parts = [np.arange(lo, hi)[:, None] if arenas[w].permuted else np.take(arenas[w].units,
                     arenas[w].order[lo:hi], axis=0) for w, lo, hi in segments]
            urows = np.concatenate(parts) if len(parts) > 1 else parts[0]
            group = np.repeat([keys.index(w) for w, _, _ in segments], [hi - lo for _, lo, hi in segments])
            b = urows.shape[0]
        g, p = self.n_cols, Payload()
        grp = None if group is None or len(arena_list) == 1 else group[:, None]

        def x(key: str, rows: Rows, shape: tuple[int, ...]) -> None:
            p.xs[key] = rows.blocks(shape)

        def meta(rows: Rows) -> None:
            ints = rows.take_ints()  # [1 + n_obs, b]: cond_id then the obs codes
            p.arrays["cond_id"] = ints[0]
            if self._vectors is not None:
                p.arrays["cond"] = np.take(self._vectors, ints[0], axis=0)
            for i, f in enumerate(self.obs_fields, start=1):
                p.arrays[f] = ints[i]

        if self.sample == "cells":
            rows = Rows(arena_list, grp, slice(lo0, hi0) if urows is None else urows[:, :1])
            x("X", rows, (b, g))
            p.arrays["sample_id"] = rows.take(SAMPLE_ID)
            meta(rows)
            for k in self.obsm_keys:
                p.arrays[k] = rows.take(k)
        elif self.sample == "pairs":
            assert urows is not None  # pairs and sentences arenas are never permuted
            ctrl, pert = Rows(arena_list, grp, urows[:, :1]), Rows(arena_list, grp, urows[:, 1:2])
            x("x_ctrl", ctrl, (b, g))
            x("x_pert", pert, (b, g))
            p.arrays["ctrl_id"] = ctrl.take(SAMPLE_ID)
            p.arrays["pert_id"] = pert.take(SAMPLE_ID)
            meta(pert)
            for k in self.obsm_keys:
                p.arrays[k] = pert.take(k)
        else:
            assert urows is not None
            length = urows.shape[1] // 2
            pert, ctrl = Rows(arena_list, grp, urows[:, :length]), Rows(arena_list, grp, urows[:, length:])
            x("x_pert", pert, (b, length, g))
            x("x_ctrl", ctrl, (b, length, g))
            p.arrays["pert_id"] = pert.take(SAMPLE_ID).reshape(b, length)
            p.arrays["ctrl_id"] = ctrl.take(SAMPLE_ID).reshape(b, length)
            meta(Rows(arena_list, grp, urows[:, :1]))
            for k in self.obsm_keys:
                p.arrays[k] = pert.take(k).reshape(b, length, -1)
        return p
