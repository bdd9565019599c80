"""Hostile cases of issue 13 on the read side: damaged shards (point 3), a loader opened before a
rebuild (point 4), stopped processes (point 7), resume states (point 8). Tests:
``tests/loaders/test_reliability_read.py``.

``data`` of a damage case: ``(encoding, damage, target, sample)``: ``damage`` is "delete" (a zarr
chunk file, or a tar member, removed), "flip" (one byte of a chunk's or member's payload
inverted) or "code" (an obs code set to a value beyond its vocabulary, shard hash updated and
``bound`` dropped from index.json, as an older build would have left it); ``target`` the column
(or "conditions:<column>" for the condition table).
"""

from __future__ import annotations

from tests.hostile import Case

DAMAGE = "test_reliability_read::test_damaged_shard"
SKIP = "test_reliability_read::test_damaged_shard_is_skipped_and_counted"
CHANGED = "test_reliability_read::test_shard_changed_after_it_was_checked"
REBUILT = "test_reliability_read::test_loader_opened_before_a_rebuild"
STOPPED_DECODER = "test_reliability_read::test_stopped_decoder_process"
STOPPED_WORKER = "test_reliability_read::test_stopped_dataloader_worker"
RESUME = "test_reliability_read::test_resume_state_is_refused"

_DAMAGES = [  # (id stem, what is done, damage, target, sample)
    (
        "deleted-obs-chunk",
        "the first chunk of `obs/perturbation` deleted",
        "delete",
        "obs/perturbation",
        "cells",
    ),
    ("deleted-x-data-chunk", "the first chunk of `X/data` deleted", "delete", "X/data", "cells"),
    ("deleted-pairs-chunk", "the `pairs` table's chunk deleted", "delete", "pairs", "pairs"),
    ("flipped-x-indices", "one byte inside `X/indices` flipped", "flip", "X/indices", "cells"),
    ("flipped-sample-id", "one byte inside `sample_id` flipped", "flip", "sample_id", "cells"),
    (
        "obs-code-beyond-vocab",
        "an `obs/perturbation` code set to 239 (vocabulary of 10), shard hash updated and the "
        "field's `bound` removed from index.json",
        "code",
        "obs/perturbation",
        "cells",
    ),
]
_WHERE = {"zarr": "zarr chunk", "tar": "tar member"}

CASES = [
    *[
        Case(
            f"{enc}-{stem}",
            3,
            f"{enc}: {what}" + (" (" + _WHERE[enc] + ")" if damage == "delete" else ""),
            "`FormatError` naming the shard (content hash mismatch or code outside the vocabulary) "
            "before any batch "
            "of it is served (was: fill value 0 served, or a wrong row, self-pairs, code 239 with "
            "10 labels)",
            DAMAGE,
            (enc, damage, target, sample),
        )
        for enc in ("zarr", "tar")
        for stem, what, damage, target, sample in _DAMAGES
    ],
    Case(
        "zarr-deleted-chunk-no-verify",
        3,
        "zarr: the first chunk of `obs/perturbation` deleted, loader opened with `verify=False`",
        "`FormatError` naming the shard and column: 0 of its 1 chunk files (missing chunks "
        "are counted even without hashing)",
        DAMAGE,
        ("zarr", "delete", "obs/perturbation", "cells", False),
    ),
    *[
        Case(
            f"{enc}-deleted-conditions-chunk",
            3,
            f"{enc}: the condition table's `vectors` {_WHERE[enc]} deleted",
            '`FormatError` naming the condition table, also with `on_corrupt="skip"` '
            "(was: every condition vector zero)",
            DAMAGE,
            (enc, "delete", "conditions:vectors", "cells"),
        )
        for enc in ("zarr", "tar")
    ],
    *[
        Case(
            f"{enc}-skip-{stem}",
            3,
            f'{enc}: {what}, loader opened with `on_corrupt="skip"`',
            "a RuntimeWarning names the shard; its units are left out of their batches (same batch "
            "count), every "
            "other unit served once; `ds.skipped_shards` lists it",
            SKIP,
            (enc, damage, target, sample),
        )
        for enc in ("zarr", "tar")
        for stem, what, damage, target, sample in _DAMAGES[:2] + _DAMAGES[3:4]
    ],
    *[
        Case(
            f"{enc}-changed-after-first-check",
            3,
            f"{enc}: a byte of a train shard flipped after the loader's first "
            "epoch checked it, its mtime restored with `os.utime`",
            "`FormatError` naming the shard in the next epoch: "
            "a checked shard is hashed again whenever a file's inode, size, mtime or ctime changed "
            "(ctime cannot "
            "be restored)",
            CHANGED,
            enc,
        )
        for enc in ("zarr", "tar")
    ],
    Case(
        "rebuild-shards-gone",
        4,
        "a rebuild commits a new index.json and removes the opened generation's shards "
        "while a loader is mid-epoch",
        '`DatasetRebuilt`: "dataset rebuilt since this loader opened it ... reopen" '
        '(was: "missing shard", or rows of the new files)',
        REBUILT,
        ("gone", 0),
    ),
    Case(
        "rebuild-shards-gone-workers",
        4,
        "the same with 2 DataLoader workers",
        "`DatasetRebuilt` from the worker, re-raised in the training process",
        REBUILT,
        ("gone", 2),
    ),
    Case(
        "rebuild-shard-rewritten-in-place",
        4,
        "a rebuild rewrites a shard under the same name and commits a new index.json",
        "`DatasetRebuilt` (the shard no longer matches the digest the opened index names: "
        "xxh3_128, or sha256 in a dataset written before index version 4)",
        REBUILT,
        ("rewritten", 0),
    ),
    Case(
        "rebuild-generation-kept",
        4,
        "a rebuild commits a new index.json, the opened generation's shards stay "
        "(content-named generations)",
        "the epoch finishes with exactly the opened generation's cells and length",
        REBUILT,
        ("kept", 0),
    ),
    Case(
        "rebuild-before-decoder-starts",
        4,
        "index.json replaced after the loader opened it but before its decoder process started",
        "the decoder process decodes the opened index (it travels in the spec with the "
        "sha256 of its bytes), not the file on disk (was: new shards under old labels)",
        REBUILT,
        ("decoder", 0),
    ),
    Case(
        "decoder-sigstop",
        7,
        "the decoder process stopped with SIGSTOP mid-training (`timeout=2`)",
        "after 2 s without a heartbeat: RuntimeWarning, the child is killed, the epoch completes "
        "in-process with "
        "the same batches (was: hang forever)",
        STOPPED_DECODER,
        2.0,
    ),
    Case(
        "worker-sigstop",
        7,
        "a DataLoader worker stopped with SIGSTOP (`num_workers=2, timeout=2`)",
        "`LoaderTimeout` naming the stopped worker's pid within seconds; all workers killed, "
        "nothing left to join "
        "at exit (was: hang even with `timeout=10`)",
        STOPPED_WORKER,
        2.0,
    ),
    Case(
        "resume-other-dataset",
        8,
        "a resume state saved on another dataset with the same unit count",
        "`ValueError` naming the state field `dataset` (the fingerprint)",
        RESUME,
        ("dataset", None),
    ),
    Case(
        "resume-batches-done-str",
        8,
        '`batches_done="3"` in a resume state',
        "`ValueError`: field 'batches_done' is str '3', expected int",
        RESUME,
        ("batches_done", "3"),
    ),
    Case(
        "resume-batches-done-bool",
        8,
        "`batches_done=True` in a resume state",
        "`ValueError`: field 'batches_done' is bool, expected int",
        RESUME,
        ("batches_done", True),
    ),
    Case(
        "resume-shuffle-int",
        8,
        "`shuffle=1` in a resume state",
        "`ValueError`: field 'shuffle' is int, expected bool",
        RESUME,
        ("shuffle", 1),
    ),
    Case(
        "resume-epoch-missing",
        8,
        "a resume state without `epoch`",
        "`ValueError` naming the missing field",
        RESUME,
        ("epoch", KeyError),
    ),
    Case(
        "resume-batches-done-too-many",
        8,
        "`batches_done` beyond the epoch's batches",
        "`ValueError` naming 'batches_done' and the valid range",
        RESUME,
        ("batches_done", 10**6),
    ),
]
