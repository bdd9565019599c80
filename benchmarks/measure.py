"""Measurement helpers: process-tree RSS sampling, throughput loops over epochs, machine
description."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

MB = 1e6
MIB = float(1 << 20)
EXPR_KEYS = ("X", "x_ctrl", "x_pert")  # expression tensors in ShardLoader batches
PACKAGES = (
    "numpy",
    "scipy",
    "anndata",
    "h5py",
    "zarr",
    "numcodecs",
    "torch",
    "psutil",
    "pandas",
    "joblib",
    "matplotlib",
    "scdataset",
)


def tree_rss(proc: psutil.Process) -> int:
    """RSS of a process plus all its descendants, in bytes (shared pages counted once per process)."""
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    return _rss_sum(procs)


def _rss_sum(procs: Iterable[psutil.Process]) -> int:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class RssSampler:
    """Samples the RSS of a process tree in a daemon thread; `peak` is the largest sum seen since
    `reset()`.

    The process list (a scan of /proc, ~2 ms) is refreshed every `refresh` seconds; the RSS of
    the known processes (~30 us each) is read every `interval` seconds, so sampling costs about
    1% of a core.
    """

    def __init__(
        self, pid: int | None = None, interval: float = 0.05, refresh: float = 0.25
    ) -> None:
        self.proc = psutil.Process(pid or os.getpid())
        self.interval, self.refresh = interval, refresh
        self.peak = 0
        self.start_rss = 0
        self._procs: list[psutil.Process] = [self.proc]
        self._listed = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> int:
        now = time.monotonic()
        if now - self._listed >= self.refresh:
            try:
                self._procs = [self.proc, *self.proc.children(recursive=True)]
            except psutil.Error:
                self._procs = [self.proc]
            self._listed = now
        rss = _rss_sum(self._procs)
        self.peak = max(self.peak, rss)
        return rss

    def reset(self) -> None:
        self._listed = 0.0
        self.start_rss = self.sample()
        self.peak = self.start_rss

    def __enter__(self) -> RssSampler:
        self.reset()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()


@dataclass
class RunStats:
    """One repeat of a throughput measurement."""

    ttfb_s: float  # time from creating the iterator to the first batch
    batches: int  # measured batches (after warm-up)
    cells: int
    payload_bytes: int  # dense float32 bytes delivered
    seconds: float  # measured wall time, epoch start-ups (reshuffle, first decode) included
    # the part of `seconds` spent in epoch start-ups (asking for an epoch -> its first batch)
    restart_s: float = 0.0
    epochs: int = 1  # epochs started in this repeat (warm-up included)

    @property
    def cells_per_s(self) -> float:
        return self.cells / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / MB / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Summary:
    """Median over repeats of a method's throughput, plus its peak RSS."""

    method: str
    params: dict[str, Any]
    cells_per_s: float
    mb_per_s: float
    ttfb_s: float
    peak_rss_mb: float
    start_rss_mb: float
    repeats: list[dict[str, float]] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def payload(batch: Any, n_genes: int) -> tuple[int, int]:
    """(cells, bytes) of dense float32 gene-expression rows in a batch (a tensor or array, or a
    loader dict)."""
    items: Iterable[Any] = (
        [batch[k] for k in EXPR_KEYS if k in batch] if isinstance(batch, dict) else (batch,)
    )
    cells = nbytes = 0
    for t in items:
        shape = tuple(getattr(t, "shape", ()))
        dtype = str(getattr(t, "dtype", ""))
        if len(shape) >= 2 and shape[-1] == n_genes and "float32" in dtype:
            rows = int(np.prod(shape[:-1]))
            cells += rows
            nbytes += rows * n_genes * 4
    return cells, nbytes


class EpochChain:
    """Epoch after epoch as one stream (``make(epoch)`` gives an epoch's iterator).

    ``restart_s`` accumulates the time from asking for an epoch to its first batch: epoch
    start-up. It is part of the measured time (a true per-epoch reshuffle is paid every epoch)
    and reported on its own.
    """

    def __init__(self, make: Callable[[int], Iterator[Any]], first_epoch: int = 0) -> None:
        self.make, self.epoch = make, first_epoch
        self.restart_s = 0.0
        self.epochs = 0
        self._it: Iterator[Any] | None = None

    def __iter__(self) -> EpochChain:
        return self

    def __next__(self) -> Any:
        for _ in range(2):
            fresh = self._it is None
            t0 = time.perf_counter()
            if self._it is None:
                self._it = self.make(self.epoch)
                self.epoch += 1
                self.epochs += 1
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = None
                continue
            if fresh:
                self.restart_s += time.perf_counter() - t0
            return batch
        raise StopIteration  # an empty epoch: nothing to stream

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()
        self._it = None


def measure_once(
    make_iter: Callable[[], Iterator[Any]],
    n_genes: int,
    *,
    warmup: int,
    seconds: float,
    min_batches: int = 1,
    max_batches: int = 1_000_000,
    multiple_of: int = 1,
) -> RunStats:
    """Time-to-first-batch, then `warmup` batches, then batches until `seconds` have passed.

    With an :class:`EpochChain` the measured time spans epoch boundaries and includes their
    start-ups (also reported apart, as ``restart_s``); a plain iterator stops at its end.
    `multiple_of` keeps measured batches aligned with a method's internal fetch blocks (scDataset
    fetches several batches at once).
    """
    t0 = time.perf_counter()
    it = make_iter()
    try:
        next(it)
        ttfb = time.perf_counter() - t0
        for _ in range(warmup):
            next(it)
    except StopIteration:
        return RunStats(time.perf_counter() - t0, 0, 0, 0, 0.0)
    batches = cells = nbytes = 0
    r0 = getattr(it, "restart_s", 0.0)
    t1 = time.perf_counter()
    wall = 0.0
    for batch in it:
        c, b = payload(batch, n_genes)
        batches += 1
        cells += c
        nbytes += b
        wall = time.perf_counter() - t1
        if batches >= max_batches or (
            batches >= min_batches and batches % multiple_of == 0 and wall >= seconds
        ):
            break
    close = getattr(it, "close", None)
    if close is not None:
        close()
    epochs = getattr(it, "epochs", 1)
    restart = getattr(it, "restart_s", 0.0) - r0
    del it
    return RunStats(ttfb, batches, cells, nbytes, wall, restart, epochs)


def summarize(
    method: str, params: dict[str, Any], runs: list[RunStats], sampler: RssSampler, note: str = ""
) -> Summary:
    ok = [r for r in runs if r.batches > 0]
    med = lambda xs: statistics.median(xs) if xs else 0.0  # noqa: E731
    return Summary(
        method=method,
        params=params,
        cells_per_s=med([r.cells_per_s for r in ok]),
        mb_per_s=med([r.mb_per_s for r in ok]),
        ttfb_s=med([r.ttfb_s for r in runs]),
        peak_rss_mb=sampler.peak / MIB,
        start_rss_mb=sampler.start_rss / MIB,
        repeats=[{**asdict(r), "cells_per_s": r.cells_per_s, "mb_per_s": r.mb_per_s} for r in runs],
        note=note,
    )


def du(paths: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> int:
    """Bytes of the files at or under ``paths`` (a path or several), like ``du -b``; a path that
    does not exist is an error, a file that goes during the walk (a download landing in a cache
    being sampled) is skipped."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return sum(tree_bytes(p) if os.path.isdir(p) else os.stat(p).st_size for p in paths)


def tree_bytes(folder: str | os.PathLike[str]) -> int:
    """Bytes of the files under ``folder``, 0 if it is gone; os.scandir, as pathlib's rglob took
    ~45 ms for one split's cache folder, and a file renamed or removed meanwhile is skipped."""
    total = 0
    try:
        with os.scandir(folder) as it:
            for e in it:
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                    total += tree_bytes(e.path) if is_dir else e.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
    except OSError:
        pass
    return total


def warm_page_cache(paths: Iterable[str | Path]) -> int:
    """Read every file once so measurements see a warm page cache. Returns bytes read."""
    total = 0
    for p in paths:
        p = Path(p)
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while chunk := fh.read(1 << 24):
                    total += len(chunk)
    return total


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine_info() -> dict[str, Any]:
    vm = psutil.virtual_memory()
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 0
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_model": cpu_model or platform.processor(),
        "cpu_count_logical": psutil.cpu_count(logical=True),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpu_affinity": affinity,
        "ram_gib": round(vm.total / (1 << 30), 2),
        "ram_available_gib": round(vm.available / (1 << 30), 2),
    }


def load_csr(path: str) -> Any:
    """The whole X of an .h5ad as an in-memory scipy CSR (h5py reads, no anndata overhead)."""
    import h5py
    import scipy.sparse as sp

    with h5py.File(path, "r") as f:
        g = f["X"]
        shape = tuple(int(s) for s in g.attrs["shape"])
        return sp.csr_matrix((g["data"][:], g["indices"][:], g["indptr"][:]), shape=shape)
