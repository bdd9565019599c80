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

Two more guards, because a state is a file anyone can edit (issue 45): every field is ranged
against the epoch it resumes (:func:`check_layout`: ``partitions`` divides the global batch,
``num_batches`` is what that layout gives, a budget ``offset`` and ``offset_step`` lie within the
epoch's plan and before ``batches_done``), and a state carries a ``digest`` of its own fields
(:func:`seal`), so an edit that stays in range (``partitions`` 1 -> 64) is refused as an edited
index is. States saved before the digest (versions 1-3) still load, range-checked, with a
``RuntimeWarning``: a running job's checkpoints must survive an upgrade, and the range checks
alone refuse every edit that would break the epoch's arithmetic (docs/LOADER.md, "Resume").
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from loaders.epoch import elastic

STATE_VERSION = 4  # 2 added "dataset" (the fingerprint); 3 the layout (partitions, global_batch,
# offset, offset_step): a state loads on another world size; 4 the state's own "digest". Versions
# 1 to 3 load, range-checked, with a warning (no digest to check).
DIGESTED = 4  # the first version that must carry a digest
MAX_INT = 1 << 53  # every integer field below this (exact in JSON doubles): no overflow downstream
MAX_PARTITIONS = 1 << 16  # canonical partitions (the world a state was first saved on), at most
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
    if type(version) is not int or version not in (1, 2, 3, STATE_VERSION):
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
    for key, want in FIELD_TYPES.items():
        if want is int and key in state and not -MAX_INT < state[key] < MAX_INT:
            raise ValueError(
                f"loader state field {key!r} is {state[key]}, outside any epoch (|value| < 2**53)"
            )


def state_digest(state: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the state's fields but ``digest``, as canonical JSON (sorted keys)."""
    body = {k: v for k, v in state.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def seal(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its ``digest`` (what :meth:`ShardLoader.state_dict` returns)."""
    state["digest"] = state_digest(state)
    return state


def check_digest(state: Mapping[str, Any]) -> None:
    """A state of version 4 or later must carry its digest and match it (an edited state is
    refused); an older one has none: it loads with a RuntimeWarning (see the module doc)."""
    if state["version"] < DIGESTED:
        warnings.warn(
            f"loader state of version {state['version']} has no digest (saved by an earlier "
            "shardsmith): its fields are range-checked, but an edit that stays in range cannot be "
            "detected; the next state_dict() is sealed",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    digest = state.get("digest")
    if not isinstance(digest, str) or digest != state_digest(state):
        what = "has no 'digest'" if digest is None else "does not match its 'digest'"
        raise ValueError(
            f"loader state {what}: it was edited or damaged after state_dict() wrote it; resume "
            "from an unedited state, or start a fresh epoch with set_epoch()"
        )


@dataclass(frozen=True)
class EpochFacts:
    """What a state is ranged against: the loader's units and global batch, and for budget
    batches the plan's batch count under ``K`` partitions (``plan_size(K)``, for the state's
    epoch)."""

    units: int
    global_batch: int
    pad: bool
    drop_last: bool
    plan_size: Callable[[int], int] | None = None  # budget batches; None: fixed-size batches


def check_layout(state: Mapping[str, Any], facts: EpochFacts) -> None:
    """Every field of a checked state within what its epoch allows; ValueError naming the field.

    ``partitions`` in [1, 65536] (and dividing the global batch for fixed-size batches),
    ``rank`` below ``world_size``, ``world_size x batch_size`` the global batch (fixed-size),
    ``num_batches`` exactly the count the state's layout gives on the state's world, and
    ``batches_done`` at most that; budget batches: ``offset`` within the plan's batches and
    ``offset_step`` at most ``batches_done`` (fixed-size batches: both 0)."""
    k, g, offset, base = layout_of(state)
    world, done = state["world_size"], state["batches_done"]

    def bad(key: str, problem: str) -> ValueError:
        return ValueError(
            f"loader state field {key!r} is {state.get(key)!r}: {problem}; the state was edited "
            "or belongs to another run: start a fresh epoch with set_epoch()"
        )

    if not 1 <= k <= MAX_PARTITIONS:
        raise bad("partitions", f"expected 1 to {MAX_PARTITIONS} canonical partitions")
    if world > MAX_PARTITIONS:
        raise bad("world_size", f"expected at most {MAX_PARTITIONS} ranks")
    if state["rank"] >= world:
        raise bad("rank", f"outside [0, world_size={world})")
    if facts.plan_size is None:
        if g % k:
            raise bad("partitions", f"does not divide the global batch ({g})")
        if state["version"] >= 3 and world * state["batch_size"] != g:
            raise bad(
                "global_batch", f"is not world_size x batch_size ({world} x {state['batch_size']})"
            )
        if offset or base:
            key = "offset" if offset else "offset_step"
            raise bad(key, "expected 0 (only budget batches keep an offset)")
        steps = elastic.global_batches(facts.units, k, g, facts.pad, facts.drop_last)
    else:
        planned = facts.plan_size(k)
        if not 0 <= offset <= planned:
            raise bad("offset", f"outside the epoch's {planned} budget batches")
        if base > done:
            raise bad("offset_step", f"after batches_done ({done})")
        steps = base + elastic.budget_steps(planned, world, offset)
    if state["num_batches"] != steps:
        raise bad("num_batches", f"the state's layout gives {steps} batches on its world")
    if done > steps:
        raise bad("batches_done", f"outside [0, {steps}]")


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
