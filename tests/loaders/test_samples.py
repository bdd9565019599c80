"""Conformance of sample types: every registered sample type has a subclass of the shipped
:class:`loaders.testing.SampleTypeTests` (here for perturbation and the test-only toy;
test_spike.py and test_ct_pipeline.py for theirs), and the last tests check that none goes without
one, entry-point plug-ins included."""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import format as fmt
from loaders.samples import SAMPLE_TYPES
from loaders.testing import SampleTypeTests, uncovered_sample_types
from tests import plugin_toy  # noqa: F401  (registers the test-only "toyvec" sample type)

TESTS = Path(__file__).resolve().parents[1]


# -- the built-in and test-only sample types -----------------------------------------------------
@pytest.fixture(scope="module")
def perturbation_fixture(tmp_path_factory: pytest.TempPathFactory, build_dataset: Any) -> Path:
    return build_dataset(
        tmp_path_factory.mktemp("conf"), "shards", n_shards=4, cells=60, genes=50
    ).root


class _Perturbation(SampleTypeTests):
    @pytest.fixture
    def dataset(self, perturbation_fixture: Path) -> Path:
        return perturbation_fixture


class TestCells(_Perturbation):
    name = "cells"

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return batch["sample_id"].tolist()

    def reference_units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        # the rows stored as primary (the others: controls duplicated from other shards)
        return np.nonzero(columns[fmt.PRIMARY])[0].astype(np.int64).reshape(-1, 1)


class TestPairs(_Perturbation):
    name = "pairs"

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return list(zip(batch["ctrl_id"].tolist(), batch["pert_id"].tolist(), strict=True))

    def reference_units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.array([[c, p] for c, p in columns[fmt.PAIRS].tolist()], np.int64).reshape(-1, 2)


class TestSentences(_Perturbation):
    name = "sentences"

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return [tuple(r) for r in batch["pert_id"].tolist()]

    def reference_units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        pert, ctrl = columns[fmt.SENTENCES_PERT].tolist(), columns[fmt.SENTENCES_CTRL].tolist()
        # a sentence's L perturbed rows, then its L controls
        return np.array([p + c for p, c in zip(pert, ctrl, strict=True)], np.int64)


TOY_MANIFEST = """
[dataset]
name = "toy"
kind = "toyvec"
format = "tar"
seed = 3
shard_size_mb = 0.0003
plugins = ["tests.plugin_toy"]

[[sources]]
path = "src/*.toy"
"""


@pytest.fixture(scope="module")
def toy_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipeline.build import build

    root = tmp_path_factory.mktemp("toyconf")
    (root / "src").mkdir()
    rng = np.random.default_rng(1)
    plugin_toy.write_toy(
        root / "src" / "a.toy",
        [
            {
                "group": f"g{i % 5}",
                "vec": rng.standard_normal(4).round(3).tolist(),
                "tokens": rng.integers(0, plugin_toy.VOCAB, int(rng.integers(0, 6))).tolist(),
                "skip": i == 5,
            }
            for i in range(30)
        ],
    )
    (root / "m.toml").write_text(TOY_MANIFEST)
    build(root / "m.toml", root / "out", jobs=1, progress=False)
    return root / "out"


class TestToy(SampleTypeTests):
    name = "toyvec"

    @pytest.fixture
    def dataset(self, toy_dataset: Path) -> Path:
        return toy_dataset

    def unit_keys(self, batch: dict[str, Any]) -> list[Hashable]:
        return batch["sample_id"].tolist()

    def reference_units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        # every stored record, in stored order
        return np.arange(len(columns[fmt.SAMPLE_ID]), dtype=np.int64)[:, None]


# -- no sample type without a conformance subclass -----------------------------------------------
SUBCLASS = re.compile(
    r"^class \w+\([\w.]*(?:SampleTypeTests|_Perturbation)\):\n"
    r'(?:    """[^\n]*"""\n\n)?    name = "(\w+)"',
    re.M,
)


def _covered() -> set[str]:
    """Names with a subclass: in this folder's test modules (as text: importing them all is slow),
    and among the subclasses imported in this process (a plug-in's own tests)."""
    text = "\n".join(p.read_text() for p in TESTS.rglob("test_*.py"))

    def subclasses(c: type) -> list[type]:
        return [d for s in c.__subclasses__() for d in (s, *subclasses(s))]

    imported = {getattr(c, "name", None) for c in subclasses(SampleTypeTests)}
    return set(SUBCLASS.findall(text)) | {n for n in imported if isinstance(n, str)}


def test_every_registered_sample_type_has_a_conformance_subclass() -> None:
    from pipeline.model import kind_names

    kind_names()  # imports the built-in kinds and with them their sample types
    missing = uncovered_sample_types(_covered(), prefixes=("loaders", "tests"))
    assert not missing, f"sample types without a SampleTypeTests subclass: {missing}"


def test_the_check_covers_entry_point_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample type registered by an installed modality outside this repository (an entry point) is
    held to the same rule: the check imports the entry points' modules and names the type."""
    import loaders.plugins

    (tmp_path / "outside_plugin.py").write_text(
        "from loaders.samples import SampleType, register_sample_type\n\n\n"
        "@register_sample_type\nclass Untested(SampleType):\n    name = 'untested_outside'\n\n"
        "    def fields(self, index):\n        return []\n\n"
        "    def units(self, columns):\n        return None\n\n"
        "    def assemble(self, batch):\n        return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("outside_plugin")  # registered, by no installed modality yet
        before = uncovered_sample_types(_covered(), prefixes=("loaders", "tests"))
        faked = (*loaders.plugins.modality_modules(), ("outside", "outside_plugin"))
        monkeypatch.setattr(loaders.plugins, "modality_modules", lambda: faked)
        after = uncovered_sample_types(_covered(), prefixes=("loaders", "tests"))
        assert set(after) - set(before) == {"untested_outside"}, (before, after)
    finally:
        del SAMPLE_TYPES["untested_outside"]
        sys.modules.pop("outside_plugin", None)


def test_no_product_code_imports_the_conformance_suites() -> None:
    """loaders.testing and pipeline.testing import pytest and hypothesis: test suites only."""
    pattern = re.compile(
        r"^\s*(?:from|import) (?:loaders|pipeline)\.testing\b|"
        r"^\s*from (?:loaders|pipeline) import [^\n]*\btesting\b",
        re.M,
    )
    here = TESTS.parent
    found = [
        str(p.relative_to(here))
        for pkg in ("loaders", "pipeline")
        for p in (here / pkg).rglob("*.py")
        if p.name != "testing.py" and pattern.search(p.read_text())
    ]
    assert not found, f"product modules importing a conformance suite: {found}"
