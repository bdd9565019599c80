"""Which batches this rank serves in an epoch: the epoch's canonical layout on this world.

:class:`EpochPlan` is the part of a :class:`~loaders.dataset.ShardDataset` that says which units
each of its batches holds; it crosses into DataLoader workers with the dataset (plain values and
arrays). The order is :mod:`loaders.epoch.order` (windows, units) and :mod:`loaders.epoch.elastic`
(canonical partitions, global batches, this rank's slice); the plan keeps which epoch and batch an
iteration starts at and which layout an epoch uses: ``(K, offset, base)``, ``K`` canonical
partitions (default: the loader's ``partitions``, else the world size) and, for budget batches,
the flat canonical batches served (``offset``) before step ``base`` of a run resumed on another
world (its steps keep their numbers: ``base`` is the step the state was saved at). A resumed
epoch keeps the layout its state was saved with, so a run on another world continues the same
global batches; persistent DataLoader workers read it, with the epoch and start, from the shared
array :data:`SHARED_SLOTS` long (``shared``, given by ``ShardLoader``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from loaders.epoch import budget, elastic, order
from loaders.epoch.schedule import Plan, batch_segments, range_segments, runs_segments

SHARED_SLOTS = 6  # epoch, start, the resumed layout's epoch (-1: none), its K, offset, base
Layout = tuple[int, int, int]  # (partitions K, budget batches served, at step base)


class EpochPlan:
    """This rank's batch plan per epoch (see module docstring)."""

    def __init__(
        self,
        counts: np.ndarray,
        entries: Any,
        sample_type: Any,
        *,
        batch_size: int,
        seed: int,
        window: int,
        shuffle: bool,
        pad: bool,
        drop_last: bool,
        rank: int,
        world_size: int,
    ) -> None:
        self.counts, self.entries, self.sample_type = counts, entries, sample_type
        self.batch_size, self.seed, self.window, self.shuffle = batch_size, seed, window, shuffle
        self.pad, self.drop_last, self.rank, self.world_size = pad, drop_last, rank, world_size
        self.partitions: int | None = None  # the loader's; None: the world size
        self.shared: Any = None  # the loader's shared slots (persistent workers), else None
        self.epoch, self.start = 0, 0
        self._resumed: tuple[int, int, int, int] | None = None  # (epoch, K, offset, base)
        self._budget: tuple[tuple[int, ...], tuple[np.ndarray, np.ndarray]] | None = None

    def set_iteration(self, epoch: int, start: int, layout: Layout | None = None) -> None:
        """Start ``epoch`` at batch ``start``; ``layout``: a resumed epoch's ``(K, offset, base)``,
        None: this world's own."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0 (got {epoch})")
        self.epoch, self.start = int(epoch), int(start)
        self._resumed = None if layout is None else (self.epoch, *map(int, layout))
        if self.shared is not None:
            self.shared[2:6] = list(self._resumed or (-1, 0, 0, 0))
            self.shared[0], self.shared[1] = self.epoch, self.start

    def iteration(self) -> tuple[int, int]:
        """``(epoch, start)`` of the iteration to serve."""
        if self.shared is not None:  # persistent workers: the main process may have moved on
            return int(self.shared[0]), int(self.shared[1])
        return self.epoch, self.start

    @property
    def global_batch(self) -> int:
        """Units of one step over all ranks (fixed-size batches): what a resume must keep."""
        return self.world_size * self.batch_size

    @property
    def budgeted(self) -> bool:
        """Whether the sample type batches by a cost budget (:mod:`loaders.epoch.budget`)."""
        return getattr(self.sample_type, "budget", None) is not None

    def default_partitions(self) -> int:
        return self.world_size if self.partitions is None else int(self.partitions)

    def layout(self, epoch: int) -> Layout:
        """``(K, offset, base)`` of ``epoch``: the resumed one's, else this world's own."""
        resumed = self._resumed
        if self.shared is not None:  # persistent workers: the main process may have moved on
            shared = tuple(int(x) for x in self.shared[2:6])
            resumed = None if shared[0] < 0 else shared
        if resumed is not None and resumed[0] == epoch:
            return resumed[1], resumed[2], resumed[3]
        return self.default_partitions(), 0, 0

    def units_per_rank(self) -> int:
        """Units a rank takes in an epoch laid out on this world (``K`` = world size)."""
        return order.rank_size(int(self.counts.sum()), self.world_size, self.pad)

    def num_batches(self, epoch: int | None = None) -> int:
        """Batches per epoch on this rank (the same on every rank). With a sample type that batches
        by cost budget (its ``budget``, e.g. a cap on points) the count depends on the epoch's
        order and, on a resumed epoch, on the world size."""
        epoch = self.iteration()[0] if epoch is None else epoch
        plan = self._budget_plan(epoch)
        if plan is not None:
            return self.layout(epoch)[2] + int(plan[0].size)
        k, _, _ = self.layout(epoch)
        n = int(self.counts.sum())
        return elastic.global_batches(n, k, self.global_batch, self.pad, self.drop_last)

    def _budget_plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray] | None:
        """This rank's budget batches from step ``base`` on, as (first, end) global positions, else
        None (fixed size)."""
        cap = getattr(self.sample_type, "budget", None)
        if cap is None:
            return None
        k, offset, _ = self.layout(epoch)
        key = (epoch, k, offset)
        if self._budget is None or self._budget[0] != key:
            bounds = self._budget_bounds(epoch, k)
            ids = elastic.budget_rank_ids(bounds.size - 1, k, self.world_size, self.rank, offset)
            self._budget = (key, (bounds[ids], bounds[ids + 1]))
        return self._budget[1]

    def _budget_bounds(self, epoch: int, k: int) -> np.ndarray:
        """The epoch's budget plan on ``k`` canonical partitions (:func:`budget.budget_bounds`)."""
        costs = budget.epoch_costs(
            self.counts,
            self.sample_type.unit_costs(self.entries),
            self.seed,
            epoch,
            self.window,
            self.shuffle,
        )
        return budget.budget_bounds(costs, self.sample_type.budget, k, self.pad)

    def plan_size(self, epoch: int, k: int) -> int:
        """Budget batches of ``epoch``'s plan on ``k`` canonical partitions (a resume state's
        ``offset`` is ranged against it: :func:`loaders.epoch.resume.check_layout`)."""
        return int(self._budget_bounds(epoch, k).size) - 1

    def plans(self, epoch: int, wstarts: np.ndarray) -> Callable[[int], Plan]:
        """Batch ``j`` -> its :data:`~loaders.epoch.schedule.Plan` (segments of windows) for
        ``epoch``."""
        bounds, plan = wstarts.tolist(), self._budget_plan(epoch)
        if plan is not None:
            first, end, base = plan[0].tolist(), plan[1].tolist(), self.layout(epoch)[2]
            # steps before ``base`` were served on the saving run's world: never asked for here
            return lambda j: range_segments(bounds, first[max(0, j - base)], end[max(0, j - base)])
        n, (k, _, _) = int(self.counts.sum()), self.layout(epoch)
        g, world, rank, pad = self.global_batch, self.world_size, self.rank, self.pad
        if k == world:  # rank r is partition r: its contiguous slice (the same plan, ~2x cheaper)
            per_rank, bs = order.rank_size(n, world, pad), self.batch_size
            return lambda j: batch_segments(bounds, per_rank, rank, bs, j)
        return lambda j: runs_segments(bounds, elastic.slice_runs(n, k, g, world, rank, j, pad))
