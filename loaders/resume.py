"""Resume states: what ``ShardLoader.state_dict()`` writes and ``load_state_dict()`` accepts.

A state is plain JSON (ints, strings, bools, the sample type's config) stored next to a
checkpoint, so it is checked like any input: every field's type exactly (``batches_done="3"`` or
``True`` is refused naming the field, never coerced), every setting that decides the sample order
equal to this loader's, and the dataset's ``fingerprint`` (the split's shards by content hash and
unit counts, ``WindowReader.fingerprint``) equal, so a state saved on another dataset, or another
build of this one, with the same unit count is refused too.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

STATE_VERSION = 2  # 2 added "dataset" (the fingerprint); version-1 states load with a warning
# settings that define which units land in which batch: resuming requires them unchanged
ORDER_KEYS = (
    "world_size",
    "batch_size",
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
}


def check_types(state: Any) -> None:
    """Refuse a state that is not a mapping, or whose fields do not have exactly their types."""
    if not isinstance(state, Mapping):
        raise ValueError(
            f"loader state must be a dict (the JSON object state_dict() returned), got "
            f"{type(state).__name__}"
        )
    version = state.get("version")
    if type(version) is not int or version not in (1, STATE_VERSION):
        raise ValueError(
            f"loader state field 'version' is {version!r}; this loader reads 1 and {STATE_VERSION}"
        )
    for key, want in FIELD_TYPES.items():
        if key == "dataset" and version == 1:
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
    for key in ("epoch", "batches_done", "seed"):
        if state[key] < 0:
            raise ValueError(f"loader state field {key!r} is {state[key]}, expected >= 0")


def check_state(state: Any, mine: Mapping[str, Any]) -> int:
    """The batches already done in ``state``, after checking it belongs to the same order as
    ``mine`` (this loader's own ``state_dict()``); raises ValueError naming the field otherwise."""
    check_types(state)
    if state["world_size"] != mine["world_size"]:
        raise ValueError(
            f"cannot resume: the state was saved with world_size={state['world_size']} but this loader "
            f"runs with world_size={mine['world_size']}; rank slices and batch boundaries depend on the world "
            "size. Resume with the same world size, or start a fresh epoch with set_epoch()."
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
    done = int(state["batches_done"])
    if not 0 <= done <= mine["num_batches"]:
        raise ValueError(
            f"loader state field 'batches_done' is {done}, outside [0, {mine['num_batches']}]"
        )
    return done
