"""The benchmark run's configuration and command line: the ``Config`` of one run, the ``--full`` and
``--quick`` presets, and how the arguments of ``python -m benchmarks.run`` override them.

Kept apart from benchmarks/run.py so that the section runners (benchmarks/run_sections.py) and the
orchestration (benchmarks/run.py) can both depend on ``Config`` without importing each other.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Config:
    mode: str
    n_cells: int
    n_genes: int
    n_perturbations: int
    sizes: tuple[int, ...]  # peak-RSS sweep (the main size is always one of them)
    incr_cells: int
    incr_files: int
    sentence_size: int
    shard_size_mb: float
    seconds: float  # measured seconds per loader repeat
    warmup: int
    repeats: int
    batch_size: int = 256
    build_jobs: int = 2
    jobs_compare: tuple[int, ...] = (1, 2)
    workers: tuple[int, ...] = (0, 2)
    scd_workers: tuple[int, ...] = (0, 2)
    samples: tuple[str, ...] = ("cells", "pairs", "sentences")
    max_pairs_per_condition: int = 500
    task_timeout_s: int = 600
    group_baselines: bool = (
        False  # quick: scipy/h5py/anndata share one interpreter (saves ~8 s of imports)
    )
    il_rounds: int = (
        5  # interleaved same-process loader vs scipy (benchmarks/interleaved.py): rounds of windows
    )
    il_workers: tuple[int, ...] = (0, 2)
    il_windows: tuple[int, ...] = (
        4,
        2,
    )  # shuffle windows in shards (4: the whole train split of the full data)

    @property
    def sentence_batch(self) -> int:
        """Sentences per batch so a sentence batch delivers as many rows as a batch of `batch_size`
        pairs."""
        return max(1, self.batch_size // self.sentence_size)


PRESETS = {
    "full": Config(
        "full",
        200_000,
        2_000,
        200,
        (50_000, 100_000, 200_000, 400_000),
        200_000,
        8,
        128,
        64,
        seconds=2.0,
        warmup=5,
        repeats=3,
    ),
    "quick": Config(
        "quick",
        20_000,
        500,
        50,
        (5_000, 20_000),
        20_000,
        8,
        32,
        4,
        seconds=0.3,
        warmup=2,
        repeats=3,
        build_jobs=1,
        scd_workers=(0,),
        group_baselines=True,
        il_rounds=2,
    ),
}


def parse_args(argv: list[str] | None, usage: str | None) -> tuple[Config, argparse.Namespace]:
    """The run's Config (a preset with the given overrides) and the parsed arguments; ``usage`` is
    the ``--help`` text (benchmarks/run.py's docstring)."""
    ap = argparse.ArgumentParser(
        description=usage, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--full", action="store_const", const="full", dest="mode")
    g.add_argument("--quick", action="store_const", const="quick", dest="mode")
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO,
        help="where BENCHMARKS.md and benchmarks/ go (default: repo)",
    )
    ap.add_argument(
        "--data-dir", type=Path, default=REPO / "bench_data", help="cache of generated data"
    )
    ap.add_argument("--cells", type=int, help="main dataset size (override the preset)")
    ap.add_argument("--genes", type=int)
    ap.add_argument("--perturbations", type=int)
    ap.add_argument("--sizes", help="comma-separated cell counts for the peak-RSS sweep")
    ap.add_argument("--incr-cells", type=int)
    ap.add_argument("--sentence-size", type=int)
    ap.add_argument("--shard-size-mb", type=float)
    ap.add_argument("--seconds", type=float, help="measured seconds per loader repeat")
    ap.add_argument("--repeats", type=int)
    ap.add_argument(
        "--build-jobs",
        type=int,
        help="--jobs of the sweep, zstd and incremental builds (default 2)",
    )
    ap.add_argument(
        "--jobs-compare",
        help="comma-separated --jobs values timed on the main dataset (default 1,2)",
    )
    ap.add_argument(
        "--keep-shards", action="store_true", help="keep the built shards under DATA_DIR/work/"
    )
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of: pipeline, loader, baselines, scdataset, annbatch, gpu, spike, ct, "
        "remote, remote_link, extras",
    )
    ap.add_argument(
        "--torch-spec",
        default=default_torch_spec(),
        help="pip requirement(s) for torch in the annbatch venv (make bench: the Makefile's TORCH_SPEC; "
        "default: the torch this interpreter has)",
    )
    a = ap.parse_args(argv)
    cfg = PRESETS[a.mode or "quick"]
    over: dict[str, Any] = {
        k: v
        for k, v in {
            "n_cells": a.cells,
            "n_genes": a.genes,
            "n_perturbations": a.perturbations,
            "incr_cells": a.incr_cells,
            "sentence_size": a.sentence_size,
            "shard_size_mb": a.shard_size_mb,
            "seconds": a.seconds,
            "repeats": a.repeats,
            "build_jobs": a.build_jobs,
        }.items()
        if v is not None
    }
    if a.sizes:
        over["sizes"] = tuple(int(s) for s in a.sizes.split(","))
    if a.jobs_compare:
        over["jobs_compare"] = tuple(int(s) for s in a.jobs_compare.split(","))
    cfg = replace(cfg, **over)
    if cfg.n_cells not in cfg.sizes:
        cfg = replace(cfg, sizes=tuple(sorted({*cfg.sizes, cfg.n_cells})))
    if any([a.cells, a.genes, a.sizes, a.incr_cells]):
        cfg = replace(cfg, mode=f"{cfg.mode}-custom")
    return cfg, a


def default_torch_spec() -> str:
    """The torch this interpreter runs, as a pin for the annbatch venv (both sides on one torch)."""
    try:
        return f"torch=={importlib.metadata.version('torch').split('+')[0]}"
    except importlib.metadata.PackageNotFoundError:
        return "torch"
