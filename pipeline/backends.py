"""Where the build's tasks run (`--backend`): a registry of executors, each running a list of tasks
and returning their results in task order, whatever order they finish in (so outputs never depend
on it).

* ``threading`` (default) and ``loky`` go through joblib: threads share the plan in memory; loky
processes
  receive the tasks pickled.
* ``dask`` and ``ray`` run on a cluster (``--scheduler ADDRESS``), or, without an address, on a
local one
  started for this build (a ``distributed.LocalCluster`` on 127.0.0.1 with one single-threaded
  worker
  process per job; ``ray.init`` with ``num_cpus = jobs``). Their tasks never carry arrays: before
  submission every array in a task's arguments is written to the build's spill folder (inside OUT,
  so on
  the shared filesystem a cluster needs anyway) and replaced by an :class:`ArrayRef`. A task
  therefore
  receives paths, row ranges and settings, a few kB (joblib's dask backend would instead push every
  argument over 1 kB through the scheduler), and the client fetches each result as soon as it is
  done,
  so a worker lost later costs only the tasks it was running (the cluster reruns those). Each shard
  is
  written under a temporary name and renamed, so a task rerun, or a rerun of the whole build after a
  crash, finds finished shards complete and does not redo them (``pipeline.resume``).
"""

from __future__ import annotations

import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from loaders.plugins.registry import Registry
from pipeline.errors import ShardsmithError
from pipeline.extras import MissingExtraError, install_command, require_backend
from pipeline.taskspill import Descriptor, describe, run_descriptor

log = logging.getLogger(__name__)
Task = Callable[[], Any]
OnResult = Callable[[Any], None]


class BackendError(ShardsmithError):
    """A backend that cannot start: unknown name, a missing optional extra, a bad option."""


class Backend(ABC):
    """Runs tasks; ``start``/``close`` bracket a build. ``remote`` backends get descriptors (module
    doc)."""

    name: ClassVar[str]
    remote: ClassVar[bool] = False
    shares_memory: ClassVar[bool] = False  # tasks run in the build's process (pipeline.parking)

    def __init__(self, jobs: int, scheduler: str | None = None) -> None:
        self.jobs, self.scheduler = jobs, scheduler
        self.max_descriptor_bytes = (
            0  # remote backends: the most bytes one task of the last map was sent
        )

    def start(self) -> None:  # noqa: B027 (optional hook)
        """Connect to, or start, the cluster."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Disconnect; stop a cluster this backend started."""

    def __enter__(self) -> Backend:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def map(
        self,
        tasks: Iterable[Task],
        desc: str,
        progress: bool,
        on_result: OnResult | None = None,
        spill: Path | None = None,
        total: int | None = None,
    ) -> list[Any]:
        """Run every task; results in task order. ``on_result`` is called in this process as each
        completes. ``tasks`` may be a lazy iterator (``total``: its expected length, for the bar):
        local backends take from it as workers free up (``pipeline.pipelined``), remote ones list
        it first."""
        done = on_result or (lambda r: None)
        if self.remote or isinstance(tasks, Sequence):
            tasks = list(tasks)
            total = len(tasks)
            if not tasks:
                return []
        if self.remote:
            if spill is None:
                raise ValueError(
                    f"the {self.name} backend needs a spill folder for its tasks' arrays"
                )
            descriptors = describe(tasks, spill / f"tasks-{desc.replace(' ', '-')}")
            self.max_descriptor_bytes = max(_pickled_size(d) for d in descriptors)
            return self._run(descriptors, desc, progress, done, total)
        return self._run(tasks, desc, progress, done, total)

    @abstractmethod
    def _run(
        self,
        tasks: Iterable[Any],
        desc: str,
        progress: bool,
        on_result: OnResult,
        total: int | None,
    ) -> list[Any]: ...


def _pickled_size(d: Descriptor) -> int:
    """The bytes a cluster is sent for one task: measured with cloudpickle, the serializer dask and
    ray use for tasks (installed with either extra). Only ever dumps; nothing here loads a
    pickle."""
    import cloudpickle  # optional: only remote backends ship pickled tasks

    return len(cloudpickle.dumps(d))


def _bar(total: int | None, desc: str, progress: bool) -> Any:
    from tqdm.auto import tqdm  # import weight: a quiet or inline build never draws a bar

    return tqdm(total=total, desc=desc, unit="task", disable=not progress)


BACKENDS: Registry[type[Backend]] = Registry("backend", error=BackendError, ordered=True)


def register_backend(cls: type[Backend]) -> type[Backend]:
    return BACKENDS.register(cls.name, cls)


def get_backend(name: str, jobs: int, scheduler: str | None = None) -> Backend:
    """A backend (not started). Unknown names and options are bad input (exit code 2)."""
    cls = BACKENDS.get(name)
    if scheduler and not cls.remote:
        raise BackendError(f"--scheduler is for the dask and ray backends, not --backend {name}")

    try:
        require_backend(name)  # before the build writes anything to its output folder
    except MissingExtraError as e:
        raise BackendError(f"{e}, or use --backend threading") from None
    return cls(jobs, scheduler)


def missing_extra(backend: str, e: ImportError) -> BackendError:

    return BackendError(
        f"--backend {backend} needs the {backend!r} extra, which is not installed ({e}): "
        f"{install_command(backend)} (in the shardsmith checkout), or use --backend threading"
    )


class _Joblib(Backend):
    """joblib's own backends: threads (one copy of the plan) or loky processes."""

    @staticmethod
    def _wrap(task: Any) -> Any:
        """What a worker runs for ``task`` (loky: the task, watched)."""
        return task

    def _run(
        self,
        tasks: Iterable[Any],
        desc: str,
        progress: bool,
        on_result: OnResult,
        total: int | None,
    ) -> list[Any]:
        out = []
        with _bar(total, desc, progress) as bar:
            if (
                self.jobs == 1 or total == 1
            ):  # inline, without importing joblib (~50 ms of a small rebuild)
                gen: Any = (t() for t in tasks)
            else:
                from joblib import (  # import weight: one task runs inline without joblib
                    Parallel,
                    delayed,
                    parallel_config,
                )

                with parallel_config(backend=self.name, n_jobs=self.jobs):
                    gen = Parallel(return_as="generator")(delayed(self._wrap(t))() for t in tasks)
            for r in gen:  # in task order (joblib's generator yields in submission order)
                on_result(r)
                out.append(r)
                bar.update()
        return out


@register_backend
class ThreadingBackend(_Joblib):
    name = "threading"
    shares_memory = True


@register_backend
class LokyBackend(_Joblib):
    name = "loky"

    @staticmethod
    def _wrap(task: Any) -> Any:
        from pipeline.orphans import (
            watched,
        )  # workers end when the build dies (kill -9), not minutes later

        return watched(task)


@register_backend
class DaskBackend(Backend):
    """distributed: the given scheduler, or a LocalCluster of `jobs` single-threaded worker
    processes."""

    name = "dask"
    remote = True

    def start(self) -> None:
        try:
            from distributed import Client, LocalCluster  # optional extra dask
        except ImportError as e:
            raise missing_extra(self.name, e) from None
        self.cluster = None
        if self.scheduler:
            self.client = Client(self.scheduler)
        else:
            self.cluster = LocalCluster(
                n_workers=self.jobs,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address=":0",
                silence_logs=logging.WARNING,
            )
            self.client = Client(self.cluster)

    def close(self) -> None:
        client, cluster = getattr(self, "client", None), getattr(self, "cluster", None)
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()

    def _run(
        self, tasks: Any, desc: str, progress: bool, on_result: OnResult, total: int | None
    ) -> list[Any]:
        from distributed import as_completed  # optional extra dask

        token = uuid.uuid4().hex[:8]
        futures = [
            self.client.submit(
                run_descriptor, d, key=f"{desc.replace(' ', '-')}-{i}-{d.label}-{token}"
            )
            for i, d in enumerate(tasks)
        ]
        position = {f.key: i for i, f in enumerate(futures)}
        out: list[Any] = [None] * len(futures)
        try:
            with _bar(len(futures), desc, progress) as bar:
                for fut, result in as_completed(futures, with_results=True):
                    out[position[fut.key]] = result
                    # the result lives here now: a worker lost later loses nothing done
                    fut.release()
                    on_result(result)
                    bar.update()
        finally:
            self.client.cancel([f for f in futures if not f.done()])
        return out


@register_backend
class RayBackend(Backend):
    """ray: the given cluster address, or a local ray started with ``num_cpus = jobs``."""

    name = "ray"
    remote = True

    def start(self) -> None:
        try:
            import ray  # optional extra ray
        except ImportError as e:
            raise missing_extra(self.name, e) from None
        self.started = not ray.is_initialized()
        if self.started:
            kw: dict[str, Any] = (
                {"address": self.scheduler}
                if self.scheduler
                else {"num_cpus": self.jobs, "include_dashboard": False}
            )
            ray.init(**kw, log_to_driver=False, configure_logging=False)
        self.task = ray.remote(num_cpus=1, max_retries=3)(run_descriptor)

    def close(self) -> None:
        import ray  # optional extra ray

        if getattr(self, "started", False):
            ray.shutdown()

    def _run(
        self, tasks: Any, desc: str, progress: bool, on_result: OnResult, total: int | None
    ) -> list[Any]:
        import ray  # optional extra ray

        refs = [self.task.remote(d) for d in tasks]
        position = {r.hex(): i for i, r in enumerate(refs)}
        out: list[Any] = [None] * len(refs)
        pending = list(refs)
        try:
            with _bar(len(refs), desc, progress) as bar:
                while pending:
                    ready, pending = ray.wait(pending, num_returns=1)
                    for ref in ready:
                        result = ray.get(ref)
                        out[position[ref.hex()]] = result
                        on_result(result)
                        bar.update()
        finally:
            for ref in pending:
                ray.cancel(ref)
        return out
