"""Hostile cases of issue 26 item 1 (shard and source digests are xxh3_128, named in the index,
version 4; sha256 still read for datasets written before; a stat cache spares rebuilds reading
unchanged sources), point 19. Tests: ``tests/format/test_digests.py``, ``tests/pipeline/test_stat_cache.py``."""

from __future__ import annotations

from tests.hostile import Case

OLD = "test_digests::test_an_old_sha256_dataset_verifies_inspects_and_loads"
OLD_BYTE = "test_digests::test_a_changed_byte_of_an_old_dataset_is_caught"
CTIME = "test_stat_cache::test_same_size_and_mtime_but_rewritten_is_read_again"
INODE = "test_stat_cache::test_a_replaced_file_is_read_again"
CONTENT = "test_stat_cache::test_a_content_change_keeping_size_and_mtime_gives_another_digest"
SHA_ENTRY = "test_stat_cache::test_a_sha256_entry_is_digested_again"

CASES = [
    Case(
        "digest-old-sha256-dataset",
        19,
        "a dataset written before index version 4 (sha256 digests; zarr and tar, committed "
        "under tests/data)",
        "`verify` passes, `inspect` exits 0, the loader with `verify='always'` serves every "
        "cell once: its digests are checked as sha256",
        OLD,
    ),
    Case(
        "digest-old-sha256-byte-changed",
        19,
        "one byte of a shard of that old dataset changed",
        "`verify` and the loader report a content hash mismatch (sha256)",
        OLD_BYTE,
    ),
    Case(
        "stat-cache-rewritten-in-place",
        19,
        "a source rewritten in place, its size and mtime set back (`touch -d`)",
        "read again on the next build, caught by its ctime; its shards reused (same bytes)",
        CTIME,
    ),
    Case(
        "stat-cache-replaced-file",
        19,
        "a source replaced under its name keeping size and mtime (`cp -p`)",
        "read again on the next build, caught by its inode",
        INODE,
    ),
    Case(
        "stat-cache-content-changed",
        19,
        "other content written into a file, size and mtime kept",
        "read again: another digest",
        CONTENT,
    ),
    Case(
        "stat-cache-sha256-entry",
        19,
        "a stat cache entry from an older build (a sha256 digest)",
        "not reused: the source is read again and digested as xxh3_128",
        SHA_ENTRY,
    ),
]
