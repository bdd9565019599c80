"""The generic loader reaches a modality only through its sample type and the registries: no
modality's names in the generic modules' code, the single-cell delivery options as sample-type
options (the old keywords still work), the shared per-unit hash, and ShardDataset's option
groups."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaders import ShardDataset, ShardLoader
from loaders import format as fmt
from loaders.options import Engine, Integrity
from loaders.samples import get_sample_type, mix64, unit_draws, unit_hash

ROOT = Path(__file__).resolve().parents[2]
WORDS = re.compile(
    r"(?<![A-Za-z0-9_])(perturbation|spike|ct|cells|pairs|sentences|csr_dense|"
    r"scatter_dense|gathered|scattered|densify|torch_sparse|ship_csr)"
    r"(?![A-Za-z0-9_])",
    re.I,
)
# what stays, and why: the csr *layout*'s densify kernel, and ShardLoader's old keyword for
# device_finish (the v1 index upgrade, which names one kind's keys, is that modality's: legacy.py)
# ship_csr is a ShardLoader keyword: loader.py takes it, options.py lists it among the loader's keywords
ALLOWED = {("kernels.py", "densify"), ("loader.py", "ship_csr"), ("options.py", "ship_csr")}
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _texts(node: ast.AST, docs: set[int]) -> list[str]:
    """The identifiers, module names and (non-docstring) strings one node holds."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword) and node.arg:
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.name]
    if isinstance(node, ast.ImportFrom) and node.module:
        return [node.module]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
        return [node.value]
    return []


def _code_words(path: Path) -> set[tuple[str, str]]:
    """(file, word) for every modality word in identifiers, imports and non-docstring strings."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, DOCUMENTED)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return {
        (path.name, m.group(0).lower())
        for node in ast.walk(tree)
        for text in _texts(node, docs)
        for m in WORDS.finditer(text)
    }


def test_generic_loader_modules_name_no_modality() -> None:
    files = [  # the top of loaders/ and every subpackage but the modalities
        p for p in sorted((ROOT / "loaders").rglob("*.py")) if "modalities" not in p.parts
    ]
    found = set().union(*(_code_words(p) for p in files))
    assert found <= ALLOWED, sorted(found - ALLOWED)


def test_a_version_1_index_is_upgraded_by_the_modality_that_wrote_it() -> None:
    from loaders.modalities.perturbation.legacy import from_v1

    assert fmt.INDEX_UPGRADES.get("1") is from_v1
    v1 = {
        "kind": "perturbation",
        "tables": ["pairs"],
        "pairing": {"k": 1},
        "stats": {"cells": 5},
        "shards": [{"file": "train-000-002-abc", "primary": 5, "pairs": 2}],
    }
    doc = from_v1(v1)
    assert doc["samples"] == ["cells", "pairs"] and doc["primary_records"] == 5
    assert doc["shards"][0]["units"] == {"cells": 5, "pairs": 2} and doc["shards"][0]["part"] == 2
    assert doc["sections"] == {"perturbation": {"pairing": {"k": 1}}}


def test_format_still_answers_the_moved_names() -> None:
    from loaders.modalities.perturbation import keys

    for name, value in keys.FORMAT_KEYS.items():
        assert getattr(fmt, name) == value == getattr(keys, name)
    assert (fmt.X, fmt.PAIRS, fmt.OBS_PREFIX) == ("X", "pairs", "obs/")
    with pytest.raises(AttributeError):
        fmt.NOT_A_KEY  # noqa: B018


def test_unit_hash_is_spikes_crop_hash() -> None:
    """Pinned: the shared helper is the hash spike crops always used (outputs did not change)."""
    from loaders.modalities.spike.samples import crop_offsets

    ids = np.array([0, 1, 2, 1 << 40])
    assert unit_hash(7, 1, ids).dtype == np.uint64
    got = crop_offsets(7, 1, ids, (250, 400), (128, 128))
    np.testing.assert_array_equal(got, [[105, 20], [86, 232], [40, 55], [106, 152]])  # as before
    draws = unit_draws(7, 1, ids, 3)
    np.testing.assert_array_equal(draws[:, 0], mix64(unit_hash(7, 1, ids)))  # starts at the hash
    np.testing.assert_array_equal(unit_draws(7, 1, ids[1:2], 5)[0, :3], draws[1])  # per unit
    assert not np.array_equal(unit_hash(7, 2, ids), unit_hash(7, 1, ids))


def test_ct_augment_draws_come_from_the_shared_helper() -> None:
    from loaders.modalities.ct.ops import draw_augment

    shapes, ids = np.array([[9, 9, 9], [4, 12, 7]]), np.array([3, 11])
    aug = draw_augment(shapes, ids, 5, 2, (3, 3, 3), (True, True, True))
    draws = unit_draws(5, 2, ids, 6)
    spans = (shapes - aug.extent + 1).astype(np.uint64)
    np.testing.assert_array_equal(aug.origin, draws[:, :3] % spans)
    np.testing.assert_array_equal(aug.flip, (draws[:, 3:] >> np.uint64(63)) == 1)


def test_delivery_options_are_the_sample_types_and_not_part_of_the_order() -> None:
    dense, parts = get_sample_type("cells"), get_sample_type("cells", densify=False)
    assert dense.get_config() == {"name": "cells", "module": type(dense).__module__}  # unchanged
    assert parts.get_config()["densify"] is False and parts != dense
    assert parts.order_config() == dense.order_config()
    with pytest.raises(TypeError, match="densify"):
        get_sample_type("spike", densify=False)


@pytest.fixture(scope="module")
def fx(build_dataset: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_dataset(
        tmp_path_factory.mktemp("boundary"), "shards", n_shards=3, cells=60, genes=21, seed=2
    )


def test_old_keywords_still_work(fx: Any) -> None:
    ds = ShardDataset(
        fx.root, batch_size=16, seed=1, densify=False, torch_sparse=True, decode_process=False
    )
    assert ds.sample == "cells"  # the index's first sample type
    assert next(iter(ds))["X"].layout == torch.sparse_csr
    dl = ShardLoader(ShardDataset(fx.root, batch_size=16, seed=1), device="cpu", ship_csr=True)
    assert dl.device_finish and dl.dataset.settings.output == "positions"
    with pytest.raises(TypeError, match="ship_csr"):
        ShardLoader(ShardDataset(fx.root, batch_size=16), device_finish=False, ship_csr=True)


def test_option_groups_equal_the_keywords(fx: Any) -> None:
    grouped = ShardDataset(
        fx.root,
        batch_size=16,
        engine=Engine(decode_process=False, decode_threads=2),
        integrity=Integrity(verify="always", on_corrupt="skip"),
    )
    flat = ShardDataset(
        fx.root,
        batch_size=16,
        decode_process=False,
        decode_threads=2,
        verify="always",
        on_corrupt="skip",
    )
    for ds in (grouped, flat):
        got = (ds.decode_process, ds.decode_threads, ds.verify, ds.on_corrupt)
        assert got == (False, 2, "always", "skip")
    assert grouped.engine == flat.engine and grouped.integrity == flat.integrity
    both = ShardDataset(
        fx.root, batch_size=16, engine=Engine(decode_threads=2), decode_process=False
    )
    assert both.engine == Engine(decode_process=False, decode_threads=2)
    with pytest.raises(TypeError, match="decode_threads"):
        ShardDataset(fx.root, engine=Engine(decode_threads=2), decode_threads=3)


def test_a_state_resumes_across_delivery_options(fx: Any) -> None:
    dl = ShardLoader(
        ShardDataset(fx.root, batch_size=16, seed=4, densify=False, decode_process=False)
    )
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    del it
    again = ShardLoader(ShardDataset(fx.root, batch_size=16, seed=4, decode_process=False))
    again.load_state_dict(state)  # densify does not decide the batches
    assert len(list(again)) == len(dl) - 1
