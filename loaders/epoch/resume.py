"""Resume states: what ``ShardLoader.state_dict()`` writes and ``load_state_dict()`` accepts.

A state is plain JSON (ints, strings, bools, the sample type's config) stored next to a
checkpoint, so it is checked like any input: every field's type exactly (``batches_done="3"`` or
``True`` is refused naming the field, never coerced), every setting that decides the sample order
equal to this loader's, and the dataset's ``fingerprint`` (the split's shards by content hash and
unit counts, ``WindowReader.fingerprint``) equal, so a state saved on another dataset, or another
build of this one, with the same unit count is refused too. The world size and per-rank batch
size may change (elastic resume, :mod:`loaders.epoch.elastic`): what must match is their product, the
global batch, and the rest of the epoch keeps the state's layout (``partitions``, ``offset``,
``offset_step``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

STATE_VERSION = 3  # 2 added "dataset" (the fingerprint); 3 the layout (partitions, global_batch,
# offset, offset_step): a state loads on another world size. Versions 1 and 2 load (1 warns).
# settings that define which units land in which batch: resuming requires them unchanged (the
# world size and per-rank batch size may change as long as their product, global_batch, does not)
ORDER_KEYS = (
    "seed",
    "sample",
    "split",
    "window",
    "shuffle",
    "pad",
    "drop_last",
    "units",
    "sample_config",  # its order options (e.g. a batch budget) decide batches too
    "dataset",
)
# version 3; older: K = world, offset 0. offset: budget batches served before step offset_step
LAYOUT_KEYS = ("partitions", "global_batch", "offset", "offset_step")
FIELD_TYPES: dict[str, type] = {
    "version": int,
    "epoch": int,
    "batches_done": int,
    "rank": int,
    "num_batches": int,
    "world_size": int,
    "batch_size": int,
    "seed": int,
    "sample": str,
    "split": str,
    "window": int,
    "shuffle": bool,
    "pad": bool,
    "drop_last": bool,
    "units": int,
    "sample_config": dict,
    "dataset": str,
    "partitions": int,
    "global_batch": int,
    "offset": int,
    "offset_step": int,
}


def check_types(state: Any) -> None:
    """Refuse a state that is not a mapping, or whose fields do not have exactly their types."""
    if not isinstance(state, Mapping):
        raise ValueError(
            f"loader state must be a dict (the JSON object state_dict() returned), got "
            f"{type(state).__name__}"
        )
    version = state.get("version")
    if type(version) is not int or version not in (1, 2, STATE_VERSION):
        raise ValueError(
            f"loader state field 'version' is {version!r}; this loader reads 1 to {STATE_VERSION}"
        )
    for key, want in FIELD_TYPES.items():
        if (key == "dataset" and version == 1) or (key in LAYOUT_KEYS and version < 3):
            continue
        if key not in state:
            raise ValueError(
                f"loader state has no field {key!r} (saved by state_dict()? it writes "
                f"{sorted(FIELD_TYPES)})"
            )
        value = state[key]
        if type(value) is not want:  # exact: bool is not an int here, "3" is not 3
            raise ValueError(
                f"loader state field {key!r} is {type(value).__name__} {value!r}, expected "
                f"{want.__name__}"
            )
    for key in (
        "epoch",
        "batches_done",
        "seed",
        "offset",
        "world_size",
        "batch_size",
        "partitions",
    ):
        least = 0 if key in ("epoch", "batches_done", "seed", "offset", "offset_step") else 1
        if key in state and state[key] < least:
            raise ValueError(f"loader state field {key!r} is {state[key]}, expected >= {least}")


def layout_of(state: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """``(partitions, global_batch, offset, offset_step)`` of a checked state (versions before 3:
    laid out on their own world)."""
    if state["version"] >= 3:
        return state["partitions"], state["global_batch"], state["offset"], state["offset_step"]
    return state["world_size"], state["world_size"] * state["batch_size"], 0, 0


def check_state(state: Any, mine: Mapping[str, Any], budgeted: bool = False) -> int:
    """The batches already done in ``state``, after checking it belongs to the same order as
    ``mine`` (this loader's own ``state_dict()``); raises ValueError naming the field otherwise.

    The world size may differ: the order is laid out on the state's canonical partitions
    (:mod:`loaders.epoch.elastic`). Fixed-size batches need the same global batch (world size x batch
    size); budget batches (``budgeted``) the same budget, in ``sample_config``. The caller checks
    ``batches_done`` against its batch count under the state's layout."""
    check_types(state)
    _, saved_g, _, _ = layout_of(state)
    if not budgeted and saved_g != mine["global_batch"]:
        raise ValueError(
            f"cannot resume: the state was saved with a global batch of {saved_g} units "
            f"(world_size={state['world_size']} x batch_size={state['batch_size']}) but this "
            f"loader's is {mine['global_batch']} (world_size={mine['world_size']} x "
            f"batch_size={mine['batch_size']}); the world size may change, the global batch may "
            f"not: pick batch_size={saved_g} / world_size, or start a fresh epoch with set_epoch()."
        )
    if state["version"] == 1:
        warnings.warn(
            "loader state of version 1 has no dataset fingerprint: cannot check that it was saved on "
            "this dataset",
            RuntimeWarning,
            stacklevel=3,
        )
    diff = {k: (state.get(k), mine[k]) for k in ORDER_KEYS if k in state and state[k] != mine[k]}
    if "dataset" in diff:
        raise ValueError(
            f"cannot resume: the state field 'dataset' (fingerprint {diff['dataset'][0]}) is not this "
            f"dataset's ({diff['dataset'][1]}): it was saved on another dataset or another build of "
            "this one. Start a fresh epoch with set_epoch()."
        )
    if diff:
        detail = ", ".join(f"{k}: saved {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise ValueError(f"cannot resume: the state belongs to a different sample order ({detail})")
    return int(state["batches_done"])


def check_done(done: int, num_batches: int) -> None:
    """``batches_done`` within the resumed epoch's batch count (under the state's layout)."""
    if not 0 <= done <= num_batches:
        raise ValueError(f"loader state field 'batches_done' is {done}, outside [0, {num_batches}]")
