"""Hostile cases of issue 13 about values kept exactly (point 5) and manifest validation (point 8).

``data`` of a validation case: (edit of the test manifest text, manifest key the error must name,
a word of the allowed values the error must state)."""

from __future__ import annotations

from tests.hostile import Case


def _sub(old: str, new: str) -> tuple[str, str]:
    return old, new


VALIDATE = "test_validation::test_manifest_value_is_refused"
DIGEST = "test_validation::test_verify_catches_an_edited_index"

EXACT = "test_exact_values::test_duplicate_columns_are_summed_once_at_build"
BIG = "test_exact_values::test_values_float32_cannot_hold_are_refused"
GENES = "test_exact_values::test_sources_without_gene_names"

CASES = [
    Case(
        "dup-columns-in-memory",
        5,
        "a CSR row repeats a column index (a small source, packed in memory)",
        "summed at build: every shard row is canonical (sorted, one entry per column, equal to the source's "
        "dense row); `stats.duplicate_entries_summed` counts them",
        EXACT,
        {"spill": False},
    ),
    Case(
        "dup-columns-spilled",
        5,
        "a CSR row repeats a column index (a source packed through spill files)",
        "the same shards as in memory; the count travels through the spill files",
        EXACT,
        {"spill": True},
    ),
    Case(
        "int-above-2p24",
        5,
        "an integer matrix holding 2**24 + 1 (float32 would round it)",
        "exit 2 naming the file, the row, the value and the fix (rescale, or another `[fields] matrix`)",
        BIG,
        {"dtype": "int64", "value": 2**24 + 1, "refused": True},
    ),
    Case(
        "int-at-2p24",
        5,
        "an integer matrix holding 2**24 exactly",
        "stored exactly",
        BIG,
        {"dtype": "int64", "value": 2**24, "refused": False},
    ),
    Case(
        "float64-counts-above-2p24",
        5,
        'a float64 matrix declared `values = "counts"` holding 2**24 + 1',
        "exit 2 naming the file, the row and the value",
        BIG,
        {"dtype": "float64", "value": 2**24 + 1, "refused": True},
    ),
    Case(
        "unnamed-genes-combined",
        5,
        "two H5-CSR files without gene names combined (columns maybe in other orders)",
        "exit 2 naming the file and the fix (`same_genes = true` in its `[[sources]]` entry, or write var names); "
        "was merged silently under invented names `gene_i`",
        GENES,
        {"files": 2, "same_genes": None},
    ),
    Case(
        "unnamed-genes-declared-same",
        5,
        "the same two files with `same_genes = true` in `[[sources]]`",
        "built; the index's var_names are `gene_0`...",
        GENES,
        {"files": 2, "same_genes": True},
    ),
    Case(
        "unnamed-genes-one-file",
        5,
        "one H5-CSR file without gene names",
        "built (nothing to mix up); var_names `gene_0`...",
        GENES,
        {"files": 1, "same_genes": None},
    ),
    Case(
        "control-empty",
        8,
        "`control = []`",
        'exit 2: `[fields.control]` needs at least one control label (was silently `["control"]`)',
        VALIDATE,
        (
            _sub('control = ["control", "non-targeting"]', "control = []"),
            "fields.control",
            "at least one",
        ),
    ),
    Case(
        "zeroshot-val-and-test-same",
        8,
        "zeroshot with the same cell type in `val_cell_types` and `test_cell_types`",
        "exit 2: `[split.test_cell_types]` names the cell type held out twice",
        VALIDATE,
        (
            _sub(
                'mode = "random"',
                'mode = "zeroshot"\nval_cell_types = ["K562"]\ntest_cell_types = ["K562"]',
            ),
            "split.test_cell_types",
            "not both",
        ),
    ),
    Case(
        "zeroshot-all-held-out",
        8,
        "zeroshot holding out every cell type (train silently empty)",
        "exit 2: `[split.val_cell_types/test_cell_types]` says how many are held out and that train keeps one",
        VALIDATE,
        (
            _sub(
                'mode = "random"',
                'mode = "zeroshot"\nval_cell_types = ["K562"]\ntest_cell_types = ["HepG2"]',
            ),
            "split.val_cell_types/test_cell_types",
            "leave at least one for train",
        ),
    ),
    Case(
        "zeroshot-val-missing",
        8,
        "zeroshot over 2 cell types with val and test fractions > 0 (val silently empty)",
        "exit 2: `[split.val_fraction]`: no cell type left for val; set it to 0 or name `val_cell_types`",
        VALIDATE,
        (_sub('mode = "random"', 'mode = "zeroshot"'), "split.val_fraction", "val_fraction = 0"),
    ),
    Case(
        "codec-level-999",
        8,
        "`codec_level = 999`",
        "exit 2: `[dataset.codec_level]` names the codec's levels 0..9 (was a blosc RuntimeError in a pack task)",
        VALIDATE,
        (_sub("seed = 0", "seed = 0\ncodec_level = 999"), "dataset.codec_level", "0..9"),
    ),
    Case(
        "seed-negative",
        8,
        "`seed = -1`",
        "exit 2: `[dataset.seed]` must be an integer >= 0 (was a numpy traceback)",
        VALIDATE,
        (_sub("seed = 0", "seed = -1"), "dataset.seed", ">= 0"),
    ),
    Case(
        "shard-size-nan",
        8,
        "`shard_size_mb = nan`",
        "exit 2: `[dataset.shard_size_mb]` is not a number >= 0.0001 (was a traceback in the plan)",
        VALIDATE,
        (_sub("shard_size_mb = 0.05", "shard_size_mb = nan"), "dataset.shard_size_mb", ">= 0.0001"),
    ),
    Case(
        "shard-size-inf",
        8,
        "`shard_size_mb = inf`",
        "exit 2: `[dataset.shard_size_mb]` is not a number >= 0.0001",
        VALIDATE,
        (_sub("shard_size_mb = 0.05", "shard_size_mb = inf"), "dataset.shard_size_mb", ">= 0.0001"),
    ),
    Case(
        "shard-size-5e-5",
        8,
        "`shard_size_mb = 5e-5`",
        "exit 2: `[dataset.shard_size_mb]` is not a number >= 0.0001 (was a traceback planning empty shards)",
        VALIDATE,
        (
            _sub("shard_size_mb = 0.05", "shard_size_mb = 5e-5"),
            "dataset.shard_size_mb",
            ">= 0.0001",
        ),
    ),
    Case(
        "shard-size-1e-9",
        8,
        "`shard_size_mb = 1e-9`",
        "exit 2 at once: `[dataset.shard_size_mb]` is not a number >= 0.0001 (was allocating until out of memory)",
        VALIDATE,
        (
            _sub("shard_size_mb = 0.05", "shard_size_mb = 1e-9"),
            "dataset.shard_size_mb",
            ">= 0.0001",
        ),
    ),
    Case(
        "sentence-size-huge",
        8,
        "`sentence_size = 10000000` (found by fuzzing)",
        "exit 2: `[pairing.sentence_size]` is outside 1..8192 (was allocating gigabytes, then a MemoryError)",
        VALIDATE,
        (_sub("sentence_size = 8", "sentence_size = 10000000"), "pairing.sentence_size", "1..8192"),
    ),
    Case(
        "covariate-is-perturbation",
        8,
        '`covariates = ["perturbation"]`',
        "exit 2: `[fields.covariates]` names the field it repeats (was a numpy traceback)",
        VALIDATE,
        (
            _sub('covariates = ["timepoint"]', 'covariates = ["perturbation"]'),
            "fields.covariates",
            "already a field",
        ),
    ),
    Case(
        "covariate-twice",
        8,
        '`covariates = ["timepoint", "timepoint"]`',
        "exit 2: `[fields.covariates]` names the repeated column",
        VALIDATE,
        (
            _sub('covariates = ["timepoint"]', 'covariates = ["timepoint", "timepoint"]'),
            "fields.covariates",
            "already a field",
        ),
    ),
    Case(
        "covariate-empty-name",
        8,
        '`covariates = ""` (found by fuzzing: a bare string is read as a list of one)',
        "exit 2: `[fields.covariates]` says the name is empty and shows the list form (was "
        "accepted: a covariate column named '')",
        VALIDATE,
        (_sub('covariates = ["timepoint"]', 'covariates = ""'), "fields.covariates", "empty name"),
    ),
    Case(
        "obsm-empty-key",
        8,
        '`obsm = ["X_pca", ""]`',
        "exit 2: `[fields.obsm]` says the key is empty (was: a missing obsm key '' at scan)",
        VALIDATE,
        (_sub('obsm = ["X_pca"]', 'obsm = ["X_pca", ""]'), "fields.obsm", "empty name"),
    ),
    Case(
        "verify-vocab-label-edited",
        8,
        "a vocabulary label in index.json edited (e.g. a perturbation renamed)",
        "`verify` fails: `'vocabularies' differs from the digest stored at build`",
        DIGEST,
        "vocabularies",
    ),
    Case(
        "verify-var-names-edited",
        8,
        "a `var_names` entry in index.json edited (genes reordered or renamed)",
        "`verify` fails: `'sections' differs from the digest stored at build`",
        DIGEST,
        "sections",
    ),
    Case(
        "verify-conditions-edited",
        8,
        "the condition table reference in index.json edited",
        "`verify` fails: `'conditions' differs from the digest stored at build`",
        DIGEST,
        "conditions",
    ),
    Case(
        "verify-digest-removed",
        8,
        "the digest itself removed from index.json",
        "`verify` fails: no content digest, rebuild",
        DIGEST,
        "digest",
    ),
    Case(
        "shard-size-tiny-cells",
        8,
        "`shard_size_mb = 0.0001` with cells bigger than that",
        "builds: at most one shard per cell, none empty (was planning empty shards: a traceback)",
        "test_validation::test_tiny_shard_size_plans_no_empty_shard",
        None,
    ),
]
