"""The process set-up of the `shardsmith` command (and `python -m pipeline`), done before anything
imports numpy.

Why: numpy's bundled OpenBLAS starts a thread per core when numpy is imported, and those threads
spin before they sleep: ~0.12 CPU-s per process on this 2-core machine (`import numpy` then a
1 s sleep: 0.18-0.22 user CPU-s against 0.07 with one BLAS thread), ~1% of a 2M-cell build, paid
again by every loky worker. No command of shardsmith calls BLAS (its numbers are numpy element-wise
work, Blosc and its own kernels), and `--jobs` decides its parallelism. A user's own setting wins.
Library users (`import loaders`, `import pipeline.build`) are left alone: only the command sets it.
"""

from __future__ import annotations

import os


def quiet_blas() -> None:
    """One BLAS thread for this process, unless the environment already says how many (OpenBLAS
    reads it once, when it loads: numpy's import)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main() -> int:
    quiet_blas()
    # imported here, not at the top: numpy must load after quiet_blas has run
    from pipeline.cli import main as cli_main

    return cli_main()
