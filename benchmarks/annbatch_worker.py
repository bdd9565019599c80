"""One side of the annbatch comparison, run in a child interpreter: ``WORKER TASK SPEC.json
OUT.json``.

Why a separate script: annbatch needs Python >= 3.12 and lives in a venv the bench makes
(``benchmarks/annbatch_bench.py``), which has neither our packages nor our dependencies; our
loader runs in ours. Both sides run the same timing loop (:func:`timed_streams`), so their
figures follow one protocol: time to first batch (loader construction to first batch), ``warmup``
batches, then ``windows`` timed windows of ``seconds`` per stream, the streams of one process
taking turns (A, B, A, B); a stream's figure is the median of its windows. Nothing but the
standard library is imported at module level: the file must load under either interpreter (and
under 3.11, where annbatch cannot be imported at all).

annbatch API followed: the 0.3.1 wheel from PyPI (what ``pip install annbatch`` gives) --
``annbatch/io.py`` ``DatasetCollection(path).add_adatas(adata_paths, *, rng=...)`` (defaults:
shuffled, ``n_obs_per_chunk=64``, ``shard_size="1GB"``, blosc lz4 clevel 3),
``annbatch/loader.py`` ``Loader(*, chunk_size=512, preload_nchunks=32, batch_size=1,
shuffle=False, to=None, preload_to_gpu=find_spec("cupy") is not None,
rng=None).use_collection(collection, load_adata=...)``, batches ``{"X", "obs", "var", "index"}``;
``to="torch"`` turns a CSR batch into a torch sparse CSR tensor (``annbatch/utils.py``
``_to_torch``); README.md: the zarrs codec pipeline "is necessary for local filesystem
performance" (``zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})``).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def marker_of(collection: str | Path) -> Path:
    """Written last, beside the collection (inside, zarr warns about a foreign file): the conversion
    finished."""
    return Path(f"{collection}.converted.json")


class Endless:
    """Epochs one after another from ``epoch(e)`` (a fresh iterator per epoch), as training does."""

    def __init__(self, epoch: Callable[[int], Iterator[Any]]) -> None:
        self.epoch, self.e, self.it = epoch, 0, epoch(0)

    def __iter__(self) -> Endless:
        return self

    def __next__(self) -> Any:
        for _ in range(2):  # an empty epoch twice in a row: the loader yields nothing at all
            try:
                return next(self.it)
            except StopIteration:
                self.e += 1
                self.it = self.epoch(self.e)
        raise RuntimeError("two epochs in a row yielded no batch")


def rows_of(batch: Any) -> int:
    """Rows in a batch: ``batch["X"]`` (dense or sparse tensor, scipy matrix) or the batch itself."""
    x = batch["X"] if isinstance(batch, dict) else batch
    return int(x.shape[0])


def timed_streams(
    makers: dict[str, Callable[[], Iterator[Any]]],
    *,
    warmup: int,
    seconds: float,
    windows: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, dict[str, Any]]:
    """The protocol shared by both interpreters: per stream, time to first batch and ``warmup``
    batches; then ``windows`` rounds in which every stream gets one window of ``seconds`` (A, B,
    A, B). cells/s: median of the stream's windows."""
    its: dict[str, Iterator[Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    for name, make in makers.items():
        t0 = clock()
        its[name] = make()
        next(its[name])
        out[name] = {"ttfb_s": clock() - t0, "windows": []}
        for _ in range(warmup):
            next(its[name])
    for _ in range(windows):
        for name, it in its.items():
            rows, t0 = 0, clock()
            while True:
                rows += rows_of(next(it))
                dt = clock() - t0
                if dt >= seconds:
                    break
            out[name]["windows"].append(rows / dt)
    for r in out.values():
        r["cells_per_s"] = statistics.median(r["windows"])
    return out


def _zarrs_on() -> bool:
    """annbatch's README: the zarrs codec pipeline for local files, when the package is there."""
    import importlib.util

    if importlib.util.find_spec("zarrs") is None:
        return False
    import zarr

    zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
    return True


def task_convert(spec: dict[str, Any]) -> dict[str, Any]:
    """The bench's .h5ad -> an annbatch collection with annbatch's own writer and its defaults
    (shuffled); written next to the target and renamed, the marker last, so a killed run leaves
    no half collection."""
    import annbatch
    import numpy as np

    zarrs = _zarrs_on()
    dest = Path(spec["collection"])
    tmp = dest.with_name(dest.name + ".tmp.zarr")  # annbatch wants a path ending in .zarr
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    annbatch.DatasetCollection(tmp).add_adatas([spec["h5ad"]], rng=np.random.default_rng(0))
    took = time.perf_counter() - t0
    doc = {
        "h5ad": spec["h5ad"],
        "convert_s": took,
        "annbatch": annbatch.__version__,
        "zarrs": zarrs,
    }
    marker = marker_of(dest)
    marker.unlink(missing_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    marker.with_suffix(".tmp").write_text(json.dumps(doc))
    os.replace(marker.with_suffix(".tmp"), marker)
    return doc


def task_annbatch(spec: dict[str, Any]) -> dict[str, Any]:
    """annbatch's Loader on the collection: ``default`` (every Loader default but
    batch_size/shuffle/rng: scipy CSR batches, densified by the consumer as
    ``torch.from_numpy(X.toarray())``) and ``sparse`` (``to="torch"``: torch sparse CSR batches,
    not densified)."""
    import annbatch
    import anndata as ad
    import numpy as np
    import torch

    zarrs = _zarrs_on()
    bs = int(spec["batch_size"])
    coll = annbatch.DatasetCollection(spec["collection"], mode="r")

    def x_only(
        g: Any,
    ) -> Any:  # README: a custom load_adata, else every obs column is loaded and yielded
        return ad.AnnData(X=ad.io.sparse_dataset(g["X"]))

    def loader(seed: int, **kw: Any) -> Any:
        return annbatch.Loader(
            batch_size=bs, shuffle=True, rng=np.random.default_rng(seed), **kw
        ).use_collection(coll, load_adata=x_only)

    def dense() -> Iterator[Any]:
        ld = loader(0)
        return (torch.from_numpy(b["X"].toarray()) for b in Endless(lambda _e: iter(ld)))

    def sparse() -> Iterator[Any]:
        ld = loader(1, to="torch")
        return Endless(lambda _e: iter(ld))

    probe = annbatch.Loader(batch_size=bs, shuffle=True)
    sampler = probe.batch_sampler
    settings = {
        k: getattr(sampler, k, getattr(sampler, "_" + k, None))
        for k in ("chunk_size", "preload_nchunks")
    }
    res = timed_streams(
        {"default": dense, "sparse": sparse},
        warmup=int(spec["warmup"]),
        seconds=float(spec["seconds"]),
        windows=int(spec["windows"]),
    )
    return {
        "streams": res,
        "annbatch": annbatch.__version__,
        "zarrs": zarrs,
        "python": sys.version.split()[0],
        "preload_to_gpu": bool(probe._preload_to_gpu),
        "settings": settings,
    }


def task_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Our loader on the train split's shards, the same two outputs: dense float32 and torch sparse
    CSR."""
    from loaders import ShardDataset, ShardLoader

    bs, root = int(spec["batch_size"]), spec["shards_root"]

    def stream(**kw: Any) -> Callable[[], Iterator[Any]]:
        def make() -> Iterator[Any]:
            dl = ShardLoader(
                ShardDataset(
                    root, split="train", sample="cells", batch_size=bs, shuffle=True, seed=0, **kw
                ),
                num_workers=0,
            )

            def epoch(e: int) -> Iterator[Any]:
                dl.set_epoch(e)
                return iter(dl)

            return Endless(epoch)

        return make

    res = timed_streams(
        {"default": stream(densify=True), "sparse": stream(densify=False, torch_sparse=True)},
        warmup=int(spec["warmup"]),
        seconds=float(spec["seconds"]),
        windows=int(spec["windows"]),
    )
    return {"streams": res, "python": sys.version.split()[0]}


def task_version(_spec: dict[str, Any]) -> dict[str, Any]:
    """What this interpreter has (the bench's check that the venv works before converting)."""
    import annbatch

    return {"annbatch": annbatch.__version__, "python": sys.version.split()[0]}


TASKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "convert": task_convert,
    "annbatch": task_annbatch,
    "ours": task_ours,
    "version": task_version,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    task, spec_path, out_path = argv[0], Path(argv[1]), Path(argv[2])
    try:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r} (known: {sorted(TASKS)})")
        doc = TASKS[task](json.loads(spec_path.read_text()))
    except (
        Exception
    ) as e:  # reported in OUT.json; the bench turns it into a note, never a failed bench
        doc = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    out_path.write_text(json.dumps(doc, indent=1, default=str))
    return 0 if "error" not in doc else 1


if __name__ == "__main__":
    sys.exit(main())
