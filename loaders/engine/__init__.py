"""The loader's engine: each window decoded once per rank (a decoder process, shared memory the
workers map), checked against the opened index, no hangs, fork-safe; see README.md here."""
