"""What a new user tripped on, trying shardsmith on real files (issue 45's last list): point 24.
Tests: ``tests/test_first_use.py``. ``data`` names the trip in the test's registry."""

from __future__ import annotations

from tests.hostile import Case

TRIP = "test_first_use::test_a_first_users_trip_is_caught"

CASES = [
    Case(
        "dataset-batchsize",
        24,
        "`ShardDataset(..., batchsize=64)`",
        "`TypeError`: unknown option 'batchsize'; did you mean 'batch_size'? (was: 'sample type "
        "cells takes no option batchsize')",
        TRIP,
        "batchsize",
    ),
    Case(
        "dataset-num-workers",
        24,
        "`ShardDataset(..., num_workers=2)`",
        "`TypeError`: 'num_workers' is an option of ShardLoader: `ShardLoader(ShardDataset(...), "
        "num_workers=2)`",
        TRIP,
        "num_workers",
    ),
    Case(
        "build-stdout-what-was-asked",
        24,
        "`shardsmith build` plain, with `--json`, with `-q`",
        "stdout: the human summary once (no JSON line); `--json`: one JSON line only (the human "
        "summary on stderr); `-q`: nothing (was: the JSON line after the summary, with -q too)",
        TRIP,
        "stdout",
    ),
    Case(
        "build-after-demo-rewrite",
        24,
        "`shardsmith demo` run again (the same files rewritten), then `build`",
        '`"changed": false`, 0 written, index.json byte for byte as it was (was: `"changed": '
        "true` with 0 written, 11 reused: new mtimes and a new generation)",
        TRIP,
        "demo-again",
    ),
    Case(
        "validate-float16-counts",
        24,
        "a float16 counts matrix checked for float32-exact values",
        "no `RuntimeWarning: overflow encountered in cast` (was: 12 in the fuzz test); values out "
        "of range stay a SourceError naming the row",
        TRIP,
        "float16",
    ),
    Case(
        "lightning-train-only",
        24,
        "`ShardDataModule(..., splits=['train'])` (the README's snippet)",
        "no `val_dataloader` hook: Lightning runs no val loop and does not warn 'You passed in a "
        "val_dataloader but have no validation_step'; with val asked for, it is there",
        TRIP,
        "lightning",
    ),
    Case(
        "cli-version-short",
        24,
        "`shardsmith -V`",
        "prints `shardsmith <version>`, exit 0 (as `--version`)",
        TRIP,
        "-V",
    ),
    Case(
        "matrix-raw",
        24,
        '`matrix = "raw"` for an `.h5ad` with a `raw` group',
        'SourceError: \'matrix "raw" is a group but not a CSR matrix ...; did you mean matrix = '
        '"raw/X"?\'',
        TRIP,
        "raw",
    ),
    Case(
        "manifest-unreadable",
        24,
        "`shardsmith build nope.toml` (no such file)",
        "`nope.toml: cannot read manifest (...)`, exit 2 (was: `nope.toml: [-] cannot read ...`)",
        TRIP,
        "nope",
    ),
    Case(
        "docs-first-ct-build",
        24,
        "a new user's first CT build and first sparse model (README, docs/CT.md, docs/LOADER.md)",
        "the docs say `max_points` = 500,000 caps each volume (a real lung: 28% of 1.77M kept) with "
        "the memory trade-off; torchsparse >= 2.1 is batch-first; a Lightning checkpoint saved "
        "after a `ddp_spawn` fit holds no loader position (use ModelCheckpoint's)",
        TRIP,
        "docs",
    ),
]
