"""Hostile cases of issue 13 about the output folder: two writers (point 1), folders that are not
ours (2), generations seen from the build side (4), leftovers of killed builds (6), permissions
(9), a full disk or read-only folder (10). Tests: tests/pipeline/test_out_folder.py,
tests/pipeline/test_out_folder_failures.py, tests/pipeline/test_generations.py."""

from __future__ import annotations

import errno

from tests.hostile import Case

LOCKED = "test_out_folder::test_second_writer_fails_at_once_naming_the_holder"
WAIT = "test_out_folder::test_wait_takes_the_lock_when_the_holder_finishes"
RACE = "test_out_folder::test_two_builds_with_different_manifests_never_mix"
FOREIGN = "test_out_folder::test_a_folder_that_is_not_ours_is_refused_untouched"
USER = "test_out_folder::test_user_files_in_a_dataset_survive_rebuilds"
UMASK = "test_out_folder::test_index_and_shards_get_the_umask_permissions"
FULL = "test_out_folder_failures::test_a_failed_write_keeps_the_previous_dataset"
KEEP = "test_generations::test_a_reader_of_generation_n_keeps_its_files_until_n_plus_2"
TOUCH = "test_generations::test_a_touch_keeps_the_older_generation_protected"
KILLED = "test_generations::test_leftovers_of_a_killed_build_are_removed_by_the_next_build"
CLEANUP = "test_generations::test_a_kill_during_cleanup_is_finished_by_the_up_to_date_shortcut"
FIRST = "test_generations::test_a_killed_first_build_can_be_rebuilt_and_reuses_its_shards"
GC = "test_generations::test_gc_removes_leftovers_and_only_ours"
GC_FOREIGN = "test_generations::test_gc_refuses_a_folder_that_is_not_ours"

CASES = [
    Case(
        "build-while-another-holds-out",
        1,
        "a second build (or `gc`) starts while a build holds `--out`",
        "exit 3 at once, naming the holder's pid and host and `--wait`; with `--wait 0.3` exit 3 after 0.3 s; "
        "once the holder is killed (`kill -9`) the kernel has released the lock and the build runs",
        LOCKED,
    ),
    Case(
        "build-with-wait",
        1,
        "`--wait 60` while another process holds `--out` for 1 s",
        "waits, then builds; exit 0",
        WAIT,
    ),
    Case(
        "two-builds-different-manifests",
        1,
        "two real builds of different manifests into one `--out`, started "
        "together (was: both exit 0, each deleting the other's shards)",
        "one exits 3 (or runs after the other); the committed index names only existing, verified shards",
        RACE,
    ),
    Case(
        "out-not-a-dataset",
        2,
        "`--out X` holding `shards/other/`, `shards/notes.txt`, `conditions-notes.md` "
        '(was: "3 stale removed", all deleted)',
        "exit 2: the folder is not a dataset and not empty, naming its entries; nothing created, changed or removed",
        FOREIGN,
        {"shards/other/x": "keep", "shards/notes.txt": "keep", "conditions-notes.md": "x"},
    ),
    Case(
        "out-is-a-repository",
        2,
        "`--out .` in a repository with `./shards/other`",
        "exit 2, nothing touched",
        FOREIGN,
        {"README.md": "repo", "shards/other/data.bin": "keep", "src/code.py": "x"},
    ),
    Case(
        "out-has-a-foreign-index.json",
        2,
        "`--out` holding an `index.json` that is not a shardsmith index",
        "exit 2, nothing touched",
        FOREIGN,
        {"index.json": '{"mine": true}', "shards/a.bin": "keep"},
    ),
    Case(
        "user-files-inside-a-dataset",
        2,
        "a user's files in `shards/` and beside `index.json` of a dataset, "
        "then three rebuilds that retire every shard around them",
        "they survive: a build deletes only files an index or a build journal named",
        USER,
    ),
    Case(
        "gc-on-a-foreign-folder",
        2,
        "`shardsmith gc` on a folder that is not a dataset, or does not exist",
        "exit 2, nothing touched",
        GC_FOREIGN,
    ),
    Case(
        "build-keeps-generation-n",
        4,
        "a loader opens generation N; the dataset is rebuilt twice",
        "every file of N stays (same bytes) after commit N+1, whose `previous.index_sha256` is N's; commit N+2 "
        "deletes exactly N's files that N+1 and N+2 do not name, listed in its `retired`",
        KEEP,
    ),
    Case(
        "build-then-loader-two-real-rebuilds",
        4,
        "a loader opens generation 1; real builds commit generation 2 "
        "mid-epoch, then generation 3 during the next epoch",
        "the first epoch finishes with exactly generation 1's cells; after generation 3 the loader raises "
        '`DatasetRebuilt` ("dataset rebuilt since this loader opened it; reopen")',
        "test_generations::test_a_loader_survives_one_real_rebuild_and_is_told_after_two",
    ),
    Case(
        "touch-keeps-generation-n",
        4,
        "a `touch`ed source: a rebuild that changes no shard",
        "no new generation (the same bytes are no change: `changed: false`), so the older "
        "`previous` stays protected (the protection is not spent on a no-op)",
        TOUCH,
    ),
    Case(
        "kill-9-while-packing-shards",
        6,
        "`kill -9` of a build (big sources: spill files) after some shards",
        "left: `.spill-<pid>/`, its journal and shards; the next build (here: up to date) removes exactly "
        "those; a user file in `shards/` stays",
        KILLED,
        ("pipeline.shardfile:write_columns", 3),
    ),
    Case(
        "kill-9-while-reading-sources",
        6,
        "`kill -9` while a source is read into spill files",
        "the same: the next build removes the spill folder and journal",
        KILLED,
        ("pipeline.modalities.perturbation.pack:scatter_range", 1),
    ),
    Case(
        "kill-9-while-writing-conditions",
        6,
        "`kill -9` while the condition table is written",
        "the same",
        KILLED,
        ("pipeline.shardfile:write_columns", 0),
    ),
    Case(
        "kill-9-during-cleanup",
        6,
        "`kill -9` after the commit, while retired shards are deleted "
        "(was: stale shards the up-to-date shortcut never collected)",
        "the index lists them in `retired`; the next build, with nothing to rebuild, deletes the rest",
        CLEANUP,
    ),
    Case(
        "kill-9-first-build",
        6,
        "`kill -9` of the first build into a new folder, then a rebuild",
        "not refused as foreign (its files are journaled); finished shards reused (same inode), the rest removed",
        FIRST,
    ),
    Case(
        "kill-9-loky-parent",
        6,
        "`kill -9` of a build running tasks on loky worker processes (was: the workers "
        "stayed for more than 5 minutes)",
        "every worker ends within a few seconds (each watches its parent pid)",
        "test_generations::test_loky_workers_end_with_their_killed_build",
    ),
    Case(
        "gc-planted-leftovers",
        6,
        "`shardsmith gc` on a dataset with spill folders, temp files, a dead build's "
        "journal and shard, and user files with look-alike names",
        "our leftovers removed, user files kept; `--drop-previous` removes the previous generation's files",
        GC,
    ),
    Case(
        "umask-022",
        9,
        "build under umask 022 (was: index.json 0600, shards 0644)",
        "index.json, shards, .build-inputs.json and the lock file all 0644",
        UMASK,
        0o022,
    ),
    Case("umask-027", 9, "build under umask 027", "all 0640", UMASK, 0o027),
    Case("umask-002", 9, "build under umask 002", "all 0664", UMASK, 0o002),
    Case(
        "disk-full-writing-a-shard",
        10,
        "ENOSPC while a shard is written (injected OSError)",
        "exit 1 naming `--out` and ENOSPC; previous index and shards unchanged; the failed build's files removed",
        FULL,
        ("shard", errno.ENOSPC, 1),
    ),
    Case(
        "disk-full-committing-index",
        10,
        "ENOSPC while index.json is written",
        "exit 1, the same guarantees",
        FULL,
        ("index", errno.ENOSPC, 1),
    ),
    Case(
        "quota-exceeded-writing-a-shard",
        10,
        "EDQUOT while a shard is written",
        "exit 1, the same",
        FULL,
        ("shard", errno.EDQUOT, 1),
    ),
    Case(
        "real-tmpfs-full-then-read-only",
        10,
        "a real tmpfs (`unshare -rm`, where the platform allows) with room for "
        "half a generation more: the second does not fit beside the first; then the mount is made read-only",
        "exit 1 with ENOSPC, the first generation committed, intact and alone (the failed build's files removed); "
        "then exit 2 with EROFS (the lock file cannot be opened) and the dataset still verifies",
        "test_out_folder_failures::test_a_real_full_and_read_only_file_system",
    ),
    Case(
        "read-only-out",
        10,
        "EROFS while a shard is written (a read-only mount)",
        "exit 2 naming `--out` and EROFS; the previous dataset intact",
        FULL,
        ("shard", errno.EROFS, 2),
    ),
]
