"""Benchmark harness: synthetic scPerturb-like data, loader and pipeline figures, BENCHMARKS.md.

Run ``python -m benchmarks.run --quick --out DIR`` (about 2 minutes) or ``--full`` (about 15 minutes
on 2 cores).
"""

from __future__ import annotations
