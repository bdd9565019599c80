"""Hostile cases of issue 45 (a dataset you did not build; point 20): an ``index.json`` that names
files outside the folder (item 1), plug-in modules to import (item 2) or no digest (item 3), each
opened as a local folder and from a real S3 server (moto), and a forged push record (item 7, in
``tests/hostile/remote.py``). Tests: ``tests/remote/test_untrusted_dataset.py``,
``tests/remote/test_remote_cache_faults.py``.

``data``: for a name case ``(key, name)``, where ``{outside}`` is a folder beside the cache,
``{up}`` sixteen ``../`` and ``{rel}`` that folder without its leading ``/``; for a plug-in case
the list ``plugins`` is given; for a digest case what is done ("plugins": a module added without
sealing again, "no-digest": the digest removed).
"""

from __future__ import annotations

from tests.hostile import Case

NAMES = "test_untrusted_dataset::test_a_name_leaving_the_folder_refuses_the_dataset"
PLUGINS = "test_untrusted_dataset::test_a_plugin_the_caller_did_not_allow_is_never_imported"
UNSEALED = "test_untrusted_dataset::test_an_unsealed_index_of_the_current_version_is_refused"

_REFUSED = (
    "`FormatError` at open naming the key (`{key} = ...`: not a plain file name), local folder "
    "and S3; `shardsmith inspect` exits 2; nothing written outside (was: downloaded and renamed "
    "outside the cache, `inspect s3://` too through the condition table)"
)
_NAMES = [  # (id, key, name, what)
    ("index-shard-name-absolute", "shards[].file", "{outside}/abs.tar", "an absolute path"),
    (
        "index-shard-name-dotdot-pth",
        "shards[].file",
        "{up}{rel}/site-packages/zz.pth",
        "`../` x 16 then a folder's `site-packages/zz.pth` (a `.pth` runs at the next start)",
    ),
    (
        "index-shard-name-in-a-folder",
        "shards[].file",
        "site-packages/zz.pth",
        "`site-packages/zz.pth` (a folder in the name: no build writes one)",
    ),
    (
        "index-conditions-name-dotdot-pth",
        "conditions.file",
        "{up}{rel}/site-packages/zz.pth",
        "`../` x 16 then `site-packages/zz.pth`",
    ),
    ("index-conditions-name-absolute", "conditions.file", "{outside}/zz.pth", "an absolute path"),
]

CASES = [
    *[
        Case(
            case_id,
            20,
            f"a re-sealed index.json whose `{key}` is {what}; `ShardDataset`, then `inspect`",
            _REFUSED.format(key=key),
            NAMES,
            (key, name),
        )
        for case_id, key, name, what in _NAMES
    ],
    Case(
        "index-plugin-this",
        20,
        'a re-sealed index.json with `plugins = ["this"]`; `ShardDataset`, then `inspect`',
        "`PluginError` saying how to allow it (`trust_plugins=`, `--trust-plugins`, "
        "`$SHARDSMITH_TRUST_PLUGINS`); `inspect` exits 2; the module is not imported (was: the "
        "Zen of Python printed at open)",
        PLUGINS,
        ["this"],
    ),
    Case(
        "index-plugin-venv-main",
        20,
        'a re-sealed index.json with `plugins = ["venv.__main__"]`; `ShardDataset`, `inspect`',
        "the same: not imported, no venv made in the working folder (was: `inspect` made one, a "
        "trainer's `ShardDataset` died with `SystemExit`)",
        PLUGINS,
        ["venv.__main__"],
    ),
    Case(
        "index-plugins-unsealed",
        20,
        "`plugins` of an index.json edited (a module already imported added) without sealing again",
        "`FormatError` at open: `'plugins' differ(s) from the digest` (index version 5: the "
        "digest covers `plugins`; was: outside the digest)",
        UNSEALED,
        "plugins",
    ),
    Case(
        "index-current-version-digest-missing",
        20,
        "the digest removed from an index.json of the current version, local folder and S3",
        "`FormatError` at open: 'index version 5 without its content digest' (versions 1-3 still "
        "open with a warning; was: a warning)",
        UNSEALED,
        "no-digest",
    ),
]

# -- the node cache when this node's disk fails it (items 10-11) ---------------------------------
DAMAGED = "test_remote_cache_faults::test_a_damaged_cached_copy_is_downloaded_again_once"
REMOVED = "test_remote_cache_faults::test_the_cache_folder_removed_mid_epoch_is_made_again"
FULL = "test_remote_cache_faults::test_a_real_full_disk_is_the_documented_cache_error"

CASES += [
    Case(
        "cache-copy-damaged",
        20,
        "one byte of a cached shard flipped after its checked download; a new reader, then "
        "`shardsmith verify s3://...` on the warm cache; then a disk that damages it again",
        "downloaded again once (one GET), same batches; `verify` exits 0; damaged again after "
        "that download: `CacheError` naming the cache folder and `cache_dir=` (was: every later "
        "process failed on it, `verify` reported the remote damaged)",
        DAMAGED,
    ),
    Case(
        "cache-folder-removed-mid-epoch",
        20,
        "the cache folder removed (`rm -rf`) after the second batch of an epoch",
        "the folder is made again (index.json put back) and the epoch's batches are those of "
        "the local folder (was: a raw `FileNotFoundError` on a `.pins` path)",
        REMOVED,
    ),
    *[
        Case(
            f"cache-real-full-disk-{stem}",
            20,
            f"the cache on a 2 MiB tmpfs (mounted by the test, as root) with {what} free",
            "`CacheError`: 'cache folder ... is full while downloading ...; nothing partial was "
            "kept: free space, set cache_limit=, ...' (was: 'GET failed (OSError: No space left "
            "on device); see the message')",
            FULL,
            leave,
        )
        for stem, what, leave in (
            ("ledger", "nothing", 0.0),
            ("download", "half the smallest shard", 0.5),
        )
    ],
]

INSIDE = "test_untrusted_dataset::test_a_name_reaching_the_cache_another_way_stays_inside"
CASES += [
    Case(
        "cache-pin-name-outside",
        20,
        "a pin file planted in the cache's `.pins/` whose name unquotes to `../../../../outside/"
        "victim.txt`, then an eviction to 0 bytes",
        "the victim is kept: a pin name that is not a plain build name is skipped (was: deleted)",
        INSIDE,
        "pin",
    ),
    Case(
        "zarr-listing-name-outside",
        20,
        "the server lists a zarr shard's objects with one key `shards/x.zarr/../../../../zz.pth`",
        "`RemoteError` naming that object ('is no object of the dataset file'); nothing written "
        "outside the temporary folder",
        INSIDE,
        "listing",
    ),
    Case(
        "cache-path-outside",
        20,
        "a shard entry named `../../../outside/victim.txt` built in code (past the index parser)",
        "`CacheError` from `NodeCache.path`: 'outside the cache folder' (the cache checks the "
        "path again)",
        INSIDE,
        "entry",
    ),
]
