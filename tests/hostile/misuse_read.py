"""Hostile cases of issue 25 on the read side: an edited index.json opened by a loader (items 6-7,
point 12), waits with no bound (item 10: a stopped worker, a glob over the whole filesystem, point
13), and a sample type the dataset does not serve (item 15, point 16). Tests:
``tests/loaders/test_open_refusals.py``.

``data`` of an edited-index case: ``(edit, outcome)``: ``edit`` names what is done to index.json
(see the test's ``_edit``), ``outcome`` is the digest key the open must name, "warn" (read with a
RuntimeWarning) or "verify" (read; ``verify`` fails it on its shard reads).
"""

from __future__ import annotations

from tests.hostile import Case

EDITED = "test_open_refusals::test_an_edited_index_is_refused_at_open"
DEFAULT_BOUND = "test_open_refusals::test_the_default_wait_on_a_worker_is_bounded"
STOPPED = "test_open_refusals::test_a_stopped_worker_is_named_within_the_bound"
ROOT_GLOB = "test_open_refusals::test_a_glob_over_the_filesystem_root_is_refused"
PROGRESS = "test_open_refusals::test_a_long_glob_reports_progress_and_its_count"
NOT_SERVED = "test_open_refusals::test_a_sample_type_the_dataset_does_not_serve"

CASES = [
    Case(
        "index-train-shard-entry-removed",
        12,
        "one train shard entry removed from index.json, then opened by a loader",
        "`ShardDataset` refuses at open: `FormatError` naming index.json and `'shards'`, saying to "
        "rebuild or run `shardsmith verify` (was: 2,812 of 4,771 cells served, no error)",
        EDITED,
        ("shard-removed", "shards"),
    ),
    Case(
        "index-vocab-labels-swapped",
        12,
        "two labels of a vocabulary swapped in index.json, then opened by a loader",
        "`FormatError` at open naming index.json and `'vocabularies'` (was: codes served under the "
        "wrong labels, no error)",
        EDITED,
        ("labels-swapped", "vocabularies"),
    ),
    Case(
        "index-unit-count-edited",
        12,
        "a shard's unit count in index.json edited",
        "`FormatError` at open naming `'shards'`",
        EDITED,
        ("units-edited", "shards"),
    ),
    Case(
        "index-older-digest-labels-swapped",
        12,
        "an index whose digest predates the shard-list key (an earlier shardsmith), labels swapped",
        "`FormatError` at open naming `'vocabularies'`: the keys its digest has are checked",
        EDITED,
        ("older-digest-labels-swapped", "vocabularies"),
    ),
    Case(
        "index-older-digest-shard-removed",
        12,
        "an index whose digest predates the shard-list key, a train shard entry removed",
        "opens (its digest cannot vouch for the shard list); `verify` fails it: fewer primary "
        "records than the plan placed; a rebuild adds the key",
        EDITED,
        ("older-digest-shard-removed", "verify"),
    ),
    Case(
        "index-digest-removed",
        12,
        "the digest removed from an index.json of version 1-3 (as written before digests)",
        "opens with a `RuntimeWarning`: read unchecked, rebuild to add one; `verify` fails it",
        EDITED,
        ("version-3-digest-removed", "warn"),
    ),
    Case(
        "index-current-version-digest-removed",
        12,
        "the digest removed from an index.json of the current version (the way to edit an index "
        "without sealing it again: issue 45, item 3)",
        "`FormatError` at open: 'index version 5 without its content digest', rebuild; `verify` "
        "fails it (was: opened with a warning)",
        EDITED,
        ("digest-removed", "refused"),
    ),
    Case(
        "loader-default-timeout",
        13,
        "`ShardLoader(ds, num_workers=2)` with no `timeout` (torch's default `timeout=0` waits for "
        "good on a stopped worker)",
        "every wait on a worker is bounded at 300 s (`DEFAULT_TIMEOUT_S`), the decoder's silence "
        "at 30 s; `timeout=None` (or 0) removes the bound, only when given",
        DEFAULT_BOUND,
    ),
    Case(
        "worker-sigstop-named",
        13,
        "a DataLoader worker stopped with SIGSTOP under a loader bound (`timeout=2`)",
        "`LoaderTimeout` within seconds naming the worker's pid and state `T`, and how to change "
        "or remove the bound",
        STOPPED,
        2.0,
    ),
    Case(
        "glob-all-of-root",
        13,
        '`path = "/**/*.h5ad"` in `[[sources]]` (was: no result in 90 s)',
        "exit 2 at once naming `sources[0].path` and `allow_root_glob = true`; nothing walked",
        ROOT_GLOB,
        ("/**/*.h5ad", False),
    ),
    Case(
        "glob-root-star",
        13,
        '`path = "/*"` in `[[sources]]`',
        "exit 2 at once naming `sources[0].path` and `allow_root_glob`",
        ROOT_GLOB,
        ("/*", False),
    ),
    Case(
        "glob-climbs-to-root",
        13,
        "a relative glob whose `..`s climb to the root (`../../…/*.h5ad`)",
        "exit 2 at once naming `sources[0].path` and `allow_root_glob`",
        ROOT_GLOB,
        ("../" * 64 + "*.h5ad", False),
    ),
    Case(
        "glob-root-allowed",
        13,
        '`path = "/*.h5ad"` with `allow_root_glob = true` in its entry',
        "matched (here: no file, so exit 2 saying so), not refused",
        ROOT_GLOB,
        ("/*.h5ad", True),
    ),
    Case(
        "glob-progress",
        13,
        "a glob whose walk takes long (slowed here; a large tree in life)",
        "INFO every 5 s with the files matched so far and the time, then the number matched",
        PROGRESS,
    ),
    Case(
        "sample-spike-on-perturbation",
        16,
        "`sample=\"spike\"` on a perturbation dataset (was: bare `KeyError: 'spikes'`)",
        "`ValueError` naming the dataset's kind and the sample types it serves (`index.samples`)",
        NOT_SERVED,
        ("perturbation", ["spike"]),
    ),
    Case(
        "sample-every-unserved-type",
        16,
        "every registered sample type a perturbation dataset does not serve (ct, spike, plug-ins)",
        "`ValueError` naming the kind and the sample types it serves, for each",
        NOT_SERVED,
        ("perturbation", None),
    ),
    Case(
        "sample-unserved-on-spike",
        16,
        '`sample="cells"` (or pairs, sentences, ct) on a spike dataset',
        "`ValueError` naming `'spike'` and `['spike']`",
        NOT_SERVED,
        ("spike", None),
    ),
    Case(
        "sample-spike-index-without-samples",
        16,
        '`sample="spike"` on a perturbation index that lists no sample types (hand-written, older)',
        "`ValueError` naming the absent field and the kind (was: `KeyError: 'spikes'`)",
        NOT_SERVED,
        ("perturbation-no-samples", ["spike"]),
    ),
]
