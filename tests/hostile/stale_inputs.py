"""Inputs a record depends on besides its source file, edited after a build (issue 45, item 4),
and an ``.nhdr`` that reads outside its folder (item 6): point 21. Tests:
``tests/test_source_companions.py``.

``data`` of a companion case: ``(source type, edit)``: the test builds a small dataset of that
type, applies ``edit`` to one source's companion file and expects that source's shards rewritten
(in ``--dry-run`` too, and with ``--rehash``), the others reused.
"""

from __future__ import annotations

from tests.hostile import Case

EDITED = "test_source_companions::test_an_edited_companion_rewrites_its_shards_only"
NHDR = "test_source_companions::test_an_nhdr_reading_outside_its_folder_is_refused"

CASES = [
    Case(
        "npy-sidecar-added",
        21,
        "a `<stem>.json` sidecar (`spacing`) added beside a `.npy` volume after a build",
        "that volume's shard is rewritten (dry-run lists it), the other reused; index.json has the "
        "new spacing (was: 0 written, 1 reused, `changed: false`, stale spacing, even with "
        "`--rehash`)",
        EDITED,
        ("npy", "sidecar-added"),
    ),
    Case(
        "npy-sidecar-edited",
        21,
        "a `.npy` volume's sidecar spacing edited after a build",
        "its shard rewritten with the new spacing, the other volume's reused",
        EDITED,
        ("npy", "sidecar-edited"),
    ),
    Case(
        "npy-sidecar-removed",
        21,
        "a `.npy` volume's sidecar deleted after a build",
        "its shard rewritten without a spacing, the other reused",
        EDITED,
        ("npy", "sidecar-removed"),
    ),
    Case(
        "nhdr-data-file-edited",
        21,
        "an `.nhdr`'s data file edited in place, its size and mtime set back",
        "that volume's shard rewritten (was: rebuilt, yet the shard reused: its key saw the same "
        "header), the other reused",
        EDITED,
        ("nhdr", "data-edited"),
    ),
    Case(
        "dicom-slice-edited",
        21,
        "one slice file of a DICOM series edited after a build",
        "that series' shard rewritten, the other series' reused",
        EDITED,
        ("dicom", "slice-edited"),
    ),
    Case(
        "spike-image-edited",
        21,
        "a paired image (`sharp/<frame>.png`) of a spike frame replaced after a build",
        "the shards holding that frame rewritten, the others reused (was: nothing rewritten)",
        EDITED,
        ("spike", "image-edited"),
    ),
    Case(
        "perturbation-features-edited",
        21,
        "the `perturbation_features` table edited after a build",
        "the condition table is rewritten with the new vectors; the cell shards (codes only) are "
        "reused",
        EDITED,
        ("h5ad", "features-edited"),
    ),
    Case(
        "nhdr-data-file-parent",
        21,
        "an `.nhdr` whose `data file:` is `../outside/secret.raw`",
        "exit 2: SourceError naming the header, 'outside the header's folder', and the manifest "
        "key `allow_outside_data`; with `[ct] allow_outside_data = true` it builds (was: that "
        "file's bytes packed, rc 0)",
        NHDR,
        "parent",
    ),
    Case(
        "nhdr-data-file-absolute",
        21,
        "an `.nhdr` whose `data file:` is an absolute path elsewhere",
        "refused the same way unless `allow_outside_data = true`",
        NHDR,
        "absolute",
    ),
    Case(
        "nhdr-data-file-longer",
        21,
        "an `.nhdr`'s raw data file longer than its header's sizes x type",
        "SourceError naming the data file, its bytes and the header's promise (was: accepted)",
        NHDR,
        "longer",
    ),
]
