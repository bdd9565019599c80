"""Column and table names of single-cell perturbation shards (kind ``perturbation``): part of the
on-disk contract (docs/FORMAT.md), defined by this modality. ``loaders.format`` still answers them
by their old names (``fmt.X``, ``fmt.PAIRS``...) through :data:`FORMAT_KEYS`.

The condition table's own names (``vectors``, ``codes``) are the format's (``loaders.format``),
since the index's ``conditions`` entry is.
"""

from __future__ import annotations

X = "X"  # csr float32 [n, genes]: the expression matrix
COND_ID = "cond_id"  # int32: row of the condition table
OBS_PREFIX = "obs/"  # obs/<field>: int32 codes into vocabularies[<field>]
OBSM_PREFIX = "obsm/"  # obsm/<key>: dense float32 embeddings
OBS_NAMES = "obs_names"  # ragged uint8: each record's cell barcode (the source's obs index), UTF-8
PAIRS = "pairs"  # int32 [P, 2]: (control row, perturbed row), local to the shard
SENTENCES_PERT = "sentences/pert"  # int32 [S, L]: local rows of one (cell_type, perturbation,
#                                    batch) group
SENTENCES_CTRL = "sentences/ctrl"  # int32 [S, L]: matched control rows

FORMAT_KEYS = {
    "X": X,
    "COND_ID": COND_ID,
    "OBS_PREFIX": OBS_PREFIX,
    "OBSM_PREFIX": OBSM_PREFIX,
    "OBS_NAMES": OBS_NAMES,
    "PAIRS": PAIRS,
    "SENTENCES_PERT": SENTENCES_PERT,
    "SENTENCES_CTRL": SENTENCES_CTRL,
}
