"""One-off experiments, not run by make bench; their verdicts: benchmarks/experiments/ANALYSIS.md."""
