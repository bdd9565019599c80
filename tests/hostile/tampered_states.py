"""Resume states edited by hand or by an attacker (issue 45, item 5): point 22. Tests:
``tests/test_resume_tampered.py``.

``data``: ``(dataset, edits, reseal, outcome)``: ``dataset`` "cells" (fixed-size batches) or "ct"
(batches by voxel budget); ``edits`` the fields set in a state saved mid-epoch; ``reseal``: the
edited state's digest recomputed (as an attacker who read the code would: the range checks must
hold alone); ``outcome`` the field the refusal names, or "warn" (loads with a RuntimeWarning).
"""

from __future__ import annotations

from tests.hostile import Case

TAMPERED = "test_resume_tampered::test_a_tampered_state_is_refused"

CASES = [
    Case(
        "state-partitions-1-to-64",
        22,
        "`partitions` 1 -> 64 in a saved state (batch 64: the range checks alone cannot tell)",
        "`ValueError`: the state does not match its `'digest'` (was: accepted; 300 units served "
        "twice, 295 of 4,771 never)",
        TAMPERED,
        ("cells", {"partitions": 64}, False, "digest"),
    ),
    Case(
        "state-partitions-not-dividing",
        22,
        "`partitions = 3` with a global batch of 64, digest recomputed",
        "`ValueError` naming `'partitions'`: does not divide the global batch",
        TAMPERED,
        ("cells", {"partitions": 3}, True, "partitions"),
    ),
    Case(
        "state-num-batches-edited",
        22,
        "`num_batches` edited, digest recomputed",
        "`ValueError` naming `'num_batches'`: the layout gives another count",
        TAMPERED,
        ("cells", {"num_batches": 1000}, True, "num_batches"),
    ),
    Case(
        "state-digest-removed",
        22,
        "the `digest` removed from a state of this version",
        "`ValueError`: the state has no `'digest'`",
        TAMPERED,
        ("cells", {"digest": None}, False, "digest"),
    ),
    Case(
        "state-before-digests",
        22,
        "a state saved by the previous shardsmith (version 3, no digest)",
        "loads with a `RuntimeWarning` (no digest to check; range-checked) and serves the rest "
        "of the epoch as a sealed one does",
        TAMPERED,
        ("cells", {"version": 3, "digest": None}, False, "warn"),
    ),
    Case(
        "state-before-digests-out-of-range",
        22,
        "a version-3 state (no digest) whose `num_batches` was edited",
        "`ValueError` naming `'num_batches'`: range checks apply to undigested states",
        TAMPERED,
        ("cells", {"version": 3, "digest": None, "num_batches": 7}, False, "num_batches"),
    ),
    Case(
        "state-ct-offset-step-huge",
        22,
        "a CT budget state with `offset_step = 10**9`, digest recomputed",
        "`ValueError` naming `'offset_step'` (was: an epoch of 1,000,000,003 batches of the same "
        "3 volumes)",
        TAMPERED,
        ("ct", {"offset_step": 10**9}, True, "offset_step"),
    ),
    Case(
        "state-ct-offset-step-2-63",
        22,
        "a CT budget state with `offset_step = 2**63`, digest recomputed",
        "`ValueError` naming `'offset_step'`: outside any epoch (was: an OverflowError traceback)",
        TAMPERED,
        ("ct", {"offset_step": 2**63}, True, "offset_step"),
    ),
    Case(
        "state-ct-offset-step-3",
        22,
        "a CT budget state with `offset_step = 3` (in range), digest recomputed",
        "`ValueError` naming `'num_batches'` (was: a volume served 3x)",
        TAMPERED,
        ("ct", {"offset_step": 3, "batches_done": 3}, True, "num_batches"),
    ),
    Case(
        "state-ct-offset-beyond-plan",
        22,
        "a CT budget state with `offset` beyond the epoch's budget batches, digest recomputed",
        "`ValueError` naming `'offset'`",
        TAMPERED,
        ("ct", {"offset": 10**6}, True, "offset"),
    ),
]
