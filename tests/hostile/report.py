"""Hostile input to `shardsmith report` (issue 47): no dataset, an unwritable page, an index written
by an older shardsmith."""

from __future__ import annotations

from tests.hostile import Case

T = "test_report_content::"
CASES = [
    Case(
        "report-no-dataset",
        14,
        "`shardsmith report` on an empty folder, or one that does not exist",
        "exit 2 as `verify`, naming the folder and what to pass; nothing written",
        T + "test_a_folder_without_a_dataset_exits_2_as_verify",
    ),
    Case(
        "report-unwritable-out",
        14,
        "`shardsmith report -o` a path under a file, or a path that is a folder",
        "exit 2 before any work, one line naming the path (`cannot write the report there`), no traceback",
        T + "test_an_unwritable_out_exits_2_naming_the_path",
    ),
    Case(
        "report-older-index",
        14,
        "`shardsmith report` on a dataset of index version 2 (sha256), and on one whose index lacks the "
        "pairing counts and condition table",
        "exit 0; the page says `index version 2` and lists the figures it cannot show and why",
        T + "test_an_older_index_gets_a_page_saying_what_it_cannot_show",
    ),
    Case(
        "report-older-spike-index",
        14,
        "`shardsmith report` on a spike dataset of index version 3 (no frames per source file counted)",
        "exit 0; the page lists `Frames per source file` as not shown, the rest drawn",
        T + "test_an_older_spike_index_names_the_counts_it_lacks",
    ),
]
