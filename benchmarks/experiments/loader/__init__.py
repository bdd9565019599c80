"""One-off experiments (not run by make bench): benchmarks/experiments/README.md."""
