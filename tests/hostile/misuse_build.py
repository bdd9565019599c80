"""Hostile cases of issue 25 on the build side (a hostile user and a new user on a fresh clone):
deletes and commits that lose data (items 1-4 and the "names read back stay inside" deliverable,
point 11), silently wrong builds (5, 8, 9: point 12), tracebacks instead of exit 2 (11: point
14), accepted but unusable datasets (12, 13: point 15) and what a new user hit next (14-17: point
16). Items 6, 7, 10 and 15's sample-type part are the read side's: ``misuse_read.py``.

``data``, where a test reads it:

* ``NAMES`` (names read back): the file the payload is written into (see that test's ``_tamper``);
* ``KEPT_NONE``: ``(kind, bad input, over a good dataset?)``;
* ``OTHER``: ``(kind of the dataset in --out, kind of the manifest, same name?)``;
* ``NUMERIC``: ``(column, values per cell, message fragment)``;
* ``NO_DATASET``: what ``verify`` is given (``missing``, ``file``, ``empty``).
"""

from __future__ import annotations

from tests.hostile import Case

JOURNAL_GC = "test_generations_escape::test_gc_ignores_a_journal_naming_outside_files"
RETIRED = (
    "test_generations_escape::"
    "test_a_retired_list_naming_outside_files_is_neither_deleted_nor_carried"
)
NAMES = "test_generations_escape::test_names_read_back_never_reach_outside"
SHARDS_LINK = "test_generations_escape::test_a_shards_folder_linking_out_is_refused"
KEPT_NONE = "test_build_refusals::test_a_build_that_keeps_no_record_commits_nothing"
OTHER = "test_build_refusals::test_another_dataset_in_out_is_refused_unless_replace"
ESCAPED_NAME = "test_manifest_hostile::test_build_without_out_never_writes_outside_shards"
TWICE = "test_manifest_hostile::test_one_file_named_by_two_entries_is_refused"
LOOP = "test_manifest_hostile::test_a_folder_link_cycle_under_a_recursive_glob_reads_each_file_once"
SWAPPED = "test_spike_resolution::test_a_swapped_resolution_is_flagged"
PLUGIN_NAME = "test_manifest_hostile::test_a_plugin_that_is_no_module_name_is_bad_input"
PLUGIN_SYNTAX = "test_manifest_hostile::test_a_plugin_with_a_syntax_error_is_bad_input_naming_it"
DEEP = "test_manifest_hostile::test_cli_exits_2_without_a_traceback"
BINS = "test_accepted_unusable::test_spike_all_frames_with_bins_that_do_not_divide_them_is_refused"
NO_GENES = "test_accepted_unusable::test_a_matrix_without_genes_is_refused"
README = "test_docs_snippets::test_readme_python_runs_on_what_make_shards_built"
WRONG_TYPE = "test_errors_that_guide::test_a_wrong_source_type_is_named_as_such"
WRONG_CASE = "test_errors_that_guide::test_a_wrong_case_control_label_is_named"
NO_DATASET = "test_errors_that_guide::test_verify_on_no_dataset_is_bad_input"
NUMERIC = "test_errors_that_guide::test_a_numeric_covariate_is_refused"
BARCODES = "test_export_names::test_shared_barcodes_are_made_unique_keeping_the_originals"
VERSION = "test_cli::test_version"

CASES = [
    # -- 11: deletes and commits that lose data (items 1-4, names read back)
    Case(
        "gc-journal-names-outside",
        11,
        "a build journal in the dataset names `../outside/j1.txt`, an absolute path, "
        "`../outside/jdir`, `sub/../../x`; then `shardsmith gc`",
        "nothing outside is deleted (was: gc removed them, a whole folder included); the names "
        "are logged as ignored",
        JOURNAL_GC,
    ),
    Case(
        "rebuild-retired-names-outside",
        11,
        "index.json's `retired` names files outside the folder (relative, absolute, through a "
        "folder link), then a rebuild",
        "neither deleted nor carried into the new index's `retired` (was: deleted by the rebuild)",
        RETIRED,
    ),
    Case(
        "names-read-back-journal",
        11,
        "a journal names `../x`, `/abs/x`, `a/../../x` or `link/x` (a folder link leading out); "
        "then a rebuild and `gc --drop-previous`",
        "nothing outside the dataset folder is deleted or written; the committed index names "
        "only files inside",
        NAMES,
        "journal",
    ),
    Case(
        "names-read-back-retired",
        11,
        "index.json's `retired` holds those payloads; a rebuild, then `gc --drop-previous`",
        "the same: nothing outside touched, the new index names only files inside",
        NAMES,
        "retired",
    ),
    Case(
        "names-read-back-shard-file",
        11,
        "a shard entry's `file` in index.json (plan key kept, `.build-inputs.json` made to "
        "match) names a folder outside `shards/`; a rebuild, then `gc --drop-previous`",
        "the name is neither taken as up to date nor reused: the shard is rebuilt under its own "
        "name (was: the new index named the outside folder as a shard); nothing outside touched",
        NAMES,
        "shard-file",
    ),
    Case(
        "names-read-back-conditions-file",
        11,
        "index.json's condition table `file` names a file outside the folder; a rebuild, then "
        "`gc --drop-previous`",
        "nothing outside touched; the new index names its own condition table",
        NAMES,
        "conditions-file",
    ),
    Case(
        "names-read-back-previous",
        11,
        "index.json's `previous` generation names shards and a condition table outside the folder; "
        "`gc --drop-previous`, then a rebuild",
        "nothing outside deleted (gc refuses each name), and the rebuild does not carry them on",
        NAMES,
        "previous",
    ),
    Case(
        "shards-folder-links-out",
        11,
        "the dataset's `shards/` is replaced by a link to a folder outside `--out`; a rebuild "
        "(and `gc`)",
        "exit 2 naming the link and its target: nothing is written or deleted through it (was: "
        "the rebuild wrote its shards into the outside folder)",
        SHARDS_LINK,
    ),
    Case(
        "kept-none-ct-normalised-first-build",
        11,
        "a first build of CT volumes already normalised to [0, 1] (every volume skipped)",
        'exit 2 naming the counted skip reason (was: exit 0, `"status": "ok"`, an empty '
        "dataset); no folder is left",
        KEPT_NONE,
        ("ct", "normalised", False),
    ),
    Case(
        "kept-none-ct-normalised-over-good",
        11,
        "the same volumes rebuilt into a folder holding a good CT dataset of the same name",
        "exit 2 naming the skip reason; the good dataset is untouched (same files, same bytes; "
        "was: replaced by an empty one, exit 0)",
        KEPT_NONE,
        ("ct", "normalised", True),
    ),
    Case(
        "kept-none-ct-uint8-over-good",
        11,
        "CT volumes exported as uint8 (0-255), rebuilt over a good dataset",
        "exit 2 naming the skip reason; the good dataset untouched",
        KEPT_NONE,
        ("ct", "uint8", True),
    ),
    Case(
        "kept-none-spike-frames-beyond-files",
        11,
        "a first spike build with `frames = 400` on files of 40 frames",
        "exit 2 naming `fewer frames than [spike] frames`; no folder is left",
        KEPT_NONE,
        ("spike", "frames", False),
    ),
    Case(
        "kept-none-spike-frames-over-good",
        11,
        "`frames = 400` rebuilt over a good spike dataset of the same name",
        "exit 2 naming the skip reason; the good dataset untouched",
        KEPT_NONE,
        ("spike", "frames", True),
    ),
    Case(
        "other-dataset-name-in-out",
        11,
        "a manifest of another `[dataset] name` built into an existing dataset's `--out` (was: "
        "silently replaced it, one warning line)",
        "exit 2 naming both datasets, their kinds and `--replace`; nothing changed. With "
        "`--replace` it builds; a rebuild of the same name is unaffected",
        OTHER,
        ("ct", "ct", False),
    ),
    Case(
        "other-dataset-kind-in-out",
        11,
        "a manifest of another kind (spike) with the same name built into a CT dataset's `--out`",
        "exit 2 naming both kinds and `--replace`; nothing changed; `--replace` builds",
        OTHER,
        ("ct", "spike", True),
    ),
    # -- 12: silently wrong (items 5, 8, 9)
    Case(
        "dataset-name-escapes-shards",
        12,
        '`[dataset] name = "../../escaped_out"` built without `--out` (the default '
        "`shards/<name>`)",
        "exit 2: `[dataset.name]` is not a plain name; nothing written outside `shards/` (was: "
        "a dataset written two folders up)",
        ESCAPED_NAME,
        "../../escaped_out",
    ),
    Case(
        "one-file-two-sources",
        12,
        "one file named by two `[[sources]]` entries (`src/sub/v0.npy` and `src/**/*.npy`)",
        "exit 2: `sources[1].path` ... already named by `sources[0]` (was: its records twice)",
        TWICE,
    ),
    Case(
        "symlink-loop-under-glob",
        12,
        "a folder link pointing back up the tree (`src/sub/up -> ..`) under a `**` glob",
        "each file is read once (was: every file again through the loop)",
        LOOP,
    ),
    Case(
        "spike-swapped-resolution",
        12,
        "a spike manifest with height and width swapped (the frame size is the same)",
        "built with a warning naming the likely width and `check [spike] height and width`; "
        "`inspect` shows frames per file",
        SWAPPED,
    ),
    # -- 14: tracebacks instead of exit 2 (item 11)
    Case(
        "plugin-is-no-module-name",
        14,
        '`plugins = ["../../evil"]` (and `/abs/mod`, `a b`, `""`, `mod.`, `1mod`)',
        "exit 2: `[dataset.plugins]` ... is not a Python module name (was: a traceback)",
        PLUGIN_NAME,
    ),
    Case(
        "plugin-with-a-syntax-error",
        14,
        "a plug-in module with a syntax error",
        "exit 2 naming the module and `SyntaxError` (was: a traceback)",
        PLUGIN_SYNTAX,
    ),
    Case(
        "toml-nested-5000-deep",
        14,
        "a manifest with an array nested 5,000 deep",
        "exit 2: nested too deeply, no traceback (was: RecursionError)",
        DEEP,
    ),
    # -- 15: accepted, unusable (items 12, 13)
    Case(
        "spike-all-frames-bins-not-dividing",
        15,
        'spike `frames = "all"` with a `num_bins` that divides no file\'s frame count',
        "exit 2 naming `spike.num_bins`; nothing committed (was: a dataset every read refused)",
        BINS,
    ),
    Case(
        "matrix-without-genes",
        15,
        "a perturbation source whose matrix has 0 genes",
        "exit 2 naming the file and `no genes` (was: a dataset of empty rows)",
        NO_GENES,
    ),
    # -- 16: what a new user hit next (items 14-17)
    Case(
        "readme-after-make-shards",
        16,
        "README's python blocks, each run alone, after `make shards` (its own recipe, same "
        "manifests and `--out` names)",
        "every block runs (was: `FormatError: no index.json` for `shards/demo-perturb`, and the "
        "Lightning block used a `ds` from another block)",
        README,
    ),
    Case(
        "h5csr-type-on-an-h5ad",
        16,
        '`type = "h5csr"` on an `.h5ad`',
        "exit 2 saying `set [[sources]] type = 'h5ad'` (was: \"the file's obs columns: none\")",
        WRONG_TYPE,
    ),
    Case(
        "control-label-wrong-case",
        16,
        '`control = ["Control"]` where the file says `control`',
        "exit 2 with `did you mean 'control'`",
        WRONG_CASE,
    ),
    Case(
        "verify-missing-folder",
        16,
        "`shardsmith verify` on a folder that does not exist",
        "exit 2 (bad input) naming it (was: exit 1, the code for a damaged dataset)",
        NO_DATASET,
        "missing",
    ),
    Case(
        "verify-a-file",
        16,
        "`shardsmith verify` on a file",
        "exit 2: not a folder",
        NO_DATASET,
        "file",
    ),
    Case(
        "verify-folder-without-index",
        16,
        "`shardsmith verify` on an empty folder",
        "exit 2: holds no index.json",
        NO_DATASET,
        "empty",
    ),
    Case(
        "numeric-covariate-many-whole-numbers",
        16,
        '`covariates = ["n_genes"]`, an int column with hundreds of values',
        "exit 2: `[fields.covariates]` names the column, its count of values and "
        "`numeric_covariates` (was: one condition per value, 658 for 10 labels)",
        NUMERIC,
        ("n_genes", "many-ints", "distinct whole numbers"),
    ),
    Case(
        "numeric-covariate-with-fractions",
        16,
        '`covariates = ["dose"]`, a float column with 3 values 0.1, 0.5, 2.5',
        "exit 2: values with a fraction, pointing to `numeric_covariates`; a column of 3 whole "
        "numbers (a replicate) still builds as labels",
        NUMERIC,
        ("dose", "fractions", "values with a fraction"),
    ),
    Case(
        "export-shared-barcodes",
        16,
        "`shardsmith export` of a dataset whose two sources share cell names",
        "obs_names made unique as anndata's `obs_names_make_unique` does (`-1`, `-2`...), the "
        'originals in `obs["original_obs_name"]`; reading it warns nothing (was: duplicate '
        "obs_names, a warning on every read)",
        BARCODES,
    ),
    Case(
        "version",
        16,
        "`shardsmith --version`",
        "prints `shardsmith <version>`, exit 0 (was: exit 2, unknown argument)",
        VERSION,
    ),
]
