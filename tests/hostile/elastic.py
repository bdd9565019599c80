"""Hostile cases of issue 24 (elastic resume: a state saved on one world loaded on another),
point 18. Tests: ``tests/loaders/test_elastic_resume.py`` (simulated ranks in one process)."""

from __future__ import annotations

from tests.hostile import Case

REFUSED = "test_elastic_resume::test_refusals_stay"
EXACT = "test_elastic_resume::test_an_epoch_that_divides_evenly_is_served_exactly_once"
CHAIN = "test_elastic_resume::test_cells_pairs_sentences_resume_on_4_3_2_ranks"

CASES = [
    Case(
        "resume-global-batch-changed",
        18,
        "a state saved on 4 ranks x 3 loaded on 3 ranks x 3 (global batch 9, not 12); or with "
        "another seed, another split, or `partitions=5` on a 12-batch",
        "`ValueError` naming the global batch of 12 (the seed, another dataset, the partitions); "
        "3 ranks x 4 loads it",
        REFUSED,
    ),
    Case(
        "resume-other-world-exact",
        18,
        "an epoch of 144 cells started on 4 ranks (0 workers), continued on 3 (2 workers), "
        "finished on 2 (1 worker), global batch 12",
        "every cell served exactly once",
        EXACT,
    ),
    Case(
        "resume-other-world-4-3-2",
        18,
        "the same for cells, pairs and sentences of an epoch that does not divide evenly",
        "every unit served, repeats fewer than one global batch; the next epoch is the ordinary "
        "2-rank one",
        CHAIN,
    ),
]
