"""Hostile cases of issue 23 (datasets on S3: the remote reader, its node cache and ``shardsmith
push``), point 17. Tests: ``tests/test_remote_{cli,store,read,cache}.py`` and
``tests/remote/test_push.py``, against a moto server (tests/remote/conftest.py) and the fault proxy.

``data``, where a test reads it:

* ``REMOTE_BAD`` (reading a bad URL): "no-index", "no-bucket", "no-credentials", "unreachable";
* ``PUSH_BAD``: "no index", "no bucket", "no credentials", "unreachable";
* ``PUSH_LOCK``: "held" (a live push holds the lock) or "stale" (a killed push left it 7 h ago);
* ``TWO_PUSHES``: the second push's server: "conditional put" or "ignores If-None-Match".
"""

from __future__ import annotations

from tests.hostile import Case

REMOTE_BAD = "test_remote_cli::test_bad_remote_input_is_exit_2_naming_url_and_fix"
UNREACHABLE = "test_remote_store::test_unreachable_endpoint_fails_within_the_bound"
RETRIES = "test_remote_store::test_retries_are_bounded_and_not_found_is_not_retried"
VERIFY_URL = "test_remote_cli::test_verify_inspect_export_a_url"
TAMPERED = "test_remote_read::test_tampered_object_is_caught"
FAULTS = "test_remote_read::test_faults_between_loader_and_server_give_identical_batches"
FULL_DISK = "test_remote_cache::test_full_disk_is_a_clear_error_and_keeps_no_partial_file"
LIMIT = "test_remote_cache::test_eviction_keeps_the_limit_and_the_batches"
WORKERS_LIMIT = "test_remote_cache::test_a_limit_too_small_for_the_loaders_workers_is_refused"
PINNED = "test_remote_cache::test_pinned_shards_are_never_evicted_and_a_full_limit_fails_not_hangs"
GENERATION = (
    "test_remote_cache::test_another_generation_at_the_same_url_is_never_served_from_the_old_cache"
)
PUSH_BAD = "test_push::test_bad_input_exits_2_naming_the_url"
FOREIGN = "test_push::test_previous_generation_kept_one_push_foreign_objects_never_deleted"
RECORD = "test_push::test_a_tampered_record_deletes_nothing_foreign"
PUSH_LOCK = "test_push::test_second_push_waits_then_exits_3"
TWO_PUSHES = "test_push::test_two_pushes_at_once_one_exits_locked"
OTHER_DATASET = "test_push::test_another_dataset_at_the_url_is_refused"
REPLACED = "test_push::test_replaced_remote_object_is_uploaded_again"
REUSE = "test_remote_generations::test_unchanged_shards_come_from_the_previous_generation"
REOPEN = "test_remote_generations::test_a_reader_of_a_deleted_generation_is_told_to_reopen"
BY_HAND = "test_remote_generations::test_an_object_deleted_by_hand_is_not_found_naming_it"
DOWN_CACHED = "test_remote_open::test_an_unreachable_server_opens_the_cached_index_with_its_age"
DOWN_MISSING = "test_remote_open::test_offline_needs_every_shard_of_the_split"

_BUILD_SHAPED = [  # a user's objects whose names look like a build's (issue 45, item 7)
    "notes-001-001-0123456789abcdef.txt",
    "conditions-0123456789abcdef.csv",
    "shards/notes-001-001-0123456789abcdef.txt",
]
_REMOTE_BAD = [  # (id stem, data, what is done)
    ("no-index", "no-index", "a prefix of an existing bucket that holds no index.json"),
    ("no-bucket", "no-bucket", "a bucket that does not exist"),
    ("no-credentials", "no-credentials", "`AWS_ACCESS_KEY_ID` and the secret key unset"),
    ("unreachable", "unreachable", "`AWS_ENDPOINT_URL` naming a port nothing listens on"),
]
_PUSH_BAD = [  # (id stem, data, what is done, the fix the message names)
    ("no-index", "no index", "a local folder with no index.json", "`no index.json`"),
    ("no-bucket", "no bucket", "a bucket that does not exist", "`the bucket does not exist`"),
    ("no-credentials", "no credentials", "no AWS credentials", "`AWS_ACCESS_KEY_ID`"),
    ("unreachable", "unreachable", "an endpoint nothing listens on", "`AWS_ENDPOINT_URL`"),
]

CASES = [
    Case(
        "remote-server-down-all-cached",
        17,
        "the S3 endpoint unreachable when a dataset is opened whose split is wholly in the node "
        "cache (its index fetched 3 h 12 min before)",
        "opens the node's copy of index.json with a `RuntimeWarning` naming its age ('fetched 3 "
        "h 12 min ago'; was: `RemoteError`, the job could not start); batches equal the local "
        "folder's",
        DOWN_CACHED,
    ),
    Case(
        "remote-server-down-shards-missing",
        17,
        "the same with shards of the split not cached; `offline=True` on a node with no copy of "
        "the index, or missing shards",
        "`RemoteError`: the server's error plus 'the node cache lacks N shard(s) of split ...'; "
        "with `offline=True`: what is missing and 'open it once with the server reachable'",
        DOWN_MISSING,
    ),
    *[
        Case(
            f"remote-url-{stem}",
            17,
            f"`shardsmith verify s3://...` and `ShardDataset(url)` on {what}",
            "exit 2 naming the URL, then the fix (no traceback); `ShardDataset` raises "
            "`FormatError` naming it; within the retry bound (under 60 s)",
            REMOTE_BAD,
            data,
        )
        for stem, data, what in _REMOTE_BAD
    ],
    Case(
        "store-unreachable-bounded",
        17,
        "a GET against an endpoint nothing listens on, retry policy `total_s=2`",
        "`RemoteError` naming the object's URL ('the endpoint does not answer'), in under 5 s",
        UNREACHABLE,
    ),
    Case(
        "store-retries-bounded",
        17,
        "every GET answered 500 by the server; then a GET of a missing object",
        "`RemoteError` after the policy's 3 attempts (2 retries), in under 5 s; a missing "
        "object is an answer, never retried",
        RETRIES,
    ),
    Case(
        "remote-object-tampered",
        17,
        "one byte of a shard object in the bucket flipped after the push",
        "downloaded once more, then an error naming the key ('downloaded twice', digest); "
        "nothing of it kept in the cache",
        TAMPERED,
    ),
    Case(
        "remote-verify-object-replaced",
        17,
        "a shard object replaced by other bytes, then `shardsmith verify s3://...`",
        "exit 1 naming the object's key and its digest, on a fresh cache",
        VERIFY_URL,
    ),
    Case(
        "remote-faults-through-proxy",
        17,
        "between loader and S3 (fault proxy): dropped connections, 500s, bodies cut short, "
        "answers later than the read timeout",
        "each retried within the bound; the batches are identical to the local folder's",
        FAULTS,
    ),
    Case(
        "cache-full-disk",
        17,
        "the cache's disk fills (`ENOSPC`) halfway through a shard download",
        "`CacheError` saying the cache is full and that nothing partial was kept; the cache "
        "holds no file of it",
        FULL_DISK,
    ),
    Case(
        "cache-limit-below-windows-in-flight",
        17,
        "`cache_limit` one byte below the windows in flight; then exactly at it, for two epochs",
        "refused at open (`ValueError`: 'smaller than the windows in flight'); at the limit the "
        "cache never exceeds it, evicted shards are fetched again and the batches are the "
        "local folder's",
        LIMIT,
    ),
    Case(
        "cache-limit-below-workers-windows",
        17,
        "`cache_limit` holds one reading process's windows in flight; "
        "`ShardLoader(num_workers=2)` over it",
        "refused when the loader is made (`ValueError` naming `num_workers=2` and the bytes "
        "needed; was: a download failing after a minute's wait on the workers' pins); "
        "`num_workers=1`, or twice the limit, is accepted",
        WORKERS_LIMIT,
    ),
    Case(
        "cache-pinned-never-evicted",
        17,
        "two datasets share one node cache under `cache_limit=150`; a window of the first "
        "(another process) pins its 100-byte shard, the second needs another",
        "the pinned shard is never evicted: the second raises `CacheError` ('does not fit "
        "under cache_limit', pinned) after a bounded wait (was: a hang); once unpinned, the "
        "least recently used shard goes",
        PINNED,
    ),
    Case(
        "cache-another-generation-same-url",
        17,
        "another dataset (same shard names, other contents) uploaded over the first at the "
        "same URL, the node cache warm with the first",
        "the new generation's batches, never a shard of the old one from the cache (one cache "
        "folder per generation)",
        GENERATION,
    ),
    *[
        Case(
            f"push-{stem}",
            17,
            f"`shardsmith push` with {what}",
            f"exit 2 in under 10 s naming the URL (the folder, for no index) and the fix: {fix}",
            PUSH_BAD,
            data,
        )
        for stem, data, what, fix in _PUSH_BAD
    ],
    Case(
        "push-foreign-objects-survive",
        17,
        "objects no push wrote under the prefix (`shards/README.txt`, `notes/keep.txt`), then "
        "three pushes of changed builds",
        "never deleted; the previous generation stays for readers that opened it, the one "
        "before is deleted by the next push",
        FOREIGN,
    ),
    Case(
        "push-record-tampered",
        17,
        "the push record under the prefix edited to claim `shards`, `notes`, "
        "`shards/../notes/keep.txt`, `` and `index.json`; two more pushes",
        "nothing foreign deleted, index.json kept",
        RECORD,
        (
            ["shards/README.txt", "notes/keep.txt"],
            ["shards", "notes", "shards/../notes/keep.txt", "", "index.json"],
        ),
    ),
    Case(
        "push-record-claims-build-shaped-names",
        20,
        "a user's `notes-001-001-<16 hex>.txt` and `conditions-<16 hex>.csv` at the top of the "
        "prefix, and `shards/notes-001-001-<16 hex>.txt`, claimed by an edited push record; two "
        "more pushes",
        "none deleted: only a condition table's exact name (`conditions-<16 hex>.zarr`/`.tar`) "
        "and shards under `shards/` may be (was: the top-level two were deleted)",
        RECORD,
        (_BUILD_SHAPED, _BUILD_SHAPED),
    ),
    Case(
        "push-lock-held",
        17,
        "`shardsmith push --wait 1` while another push (pid 1 on node7) holds the lock",
        "exit 3 after waiting 1 s, naming the lock's URL, the holder's pid and host; nothing "
        "pushed",
        PUSH_LOCK,
        "held",
    ),
    Case(
        "push-lock-stale",
        17,
        "a push lock left by a killed push 7 h ago",
        "refused (`LockHeldError`), saying the lock is 7.0 h old and how to remove it "
        "(`aws s3 rm ...`); never broken automatically",
        PUSH_LOCK,
        "stale",
    ),
    Case(
        "push-two-at-once",
        17,
        "a second push to the URL while the first is uploading",
        "the second is refused at once (`LockHeldError`: 'another push holds'); the first "
        "completes, its index.json committed, and releases the lock",
        TWO_PUSHES,
        "conditional put",
    ),
    Case(
        "push-server-ignores-if-none-match",
        17,
        "the same against a server that ignores the lock's conditional put (`If-None-Match`)",
        "the same: the lock is read back and its token compared, so the second is refused and "
        "the first's index.json is the one committed",
        TWO_PUSHES,
        "ignores If-None-Match",
    ),
    Case(
        "push-another-dataset-at-url",
        17,
        "the URL holds index.json of a dataset of another name",
        "exit 2 ('holds dataset ...'), the remote untouched; `--replace` pushes",
        OTHER_DATASET,
    ),
    Case(
        "remote-new-generation",
        17,
        "a new generation pushed after a one-source rebuild, read on a node whose cache holds the "
        "previous one",
        "only the changed shards are downloaded; the unchanged ones are linked from the previous "
        "generation's folder after a digest check; batches equal the local build's",
        REUSE,
        "clean",
    ),
    Case(
        "remote-new-generation-damaged-copy",
        17,
        "the same, with the previous generation's cached copy of an unchanged shard altered",
        "that shard fails the new index's digest and is downloaded (never served altered); "
        "batches equal the local build's",
        REUSE,
        "damaged",
    ),
    Case(
        "remote-opened-generation-deleted",
        17,
        "a reader opened generation N, then two pushes (N+2 deletes N's objects) before it "
        "downloads its shards",
        "`DatasetRebuilt`: the URL was pushed again since the reader opened it; open it again "
        "(as for a local folder rebuilt under a reader)",
        REOPEN,
    ),
    Case(
        "remote-shard-deleted-by-hand",
        17,
        "every object of one shard deleted from the bucket by hand (index.json unchanged)",
        "`RemoteNotFound` naming the shard's prefix ('has no objects') and the fix (push again)",
        BY_HAND,
    ),
    Case(
        "push-remote-object-replaced",
        17,
        "a pushed shard object overwritten in the bucket, then a push of the same build",
        "that object is uploaded again (then index.json); the remote bytes equal the local",
        REPLACED,
    ),
]
