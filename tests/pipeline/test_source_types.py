"""Every source type held to what the registry needs of it: a subclass of the shipped
:class:`pipeline.testing.SourceTypeContract` per type (here, and in test modules defining sources);
the check at the end fails for a registered type that has none, entry-point plug-ins included.
(Reading is tested per kind: matrix sources in test_sources.py; the toy's reading here, against
values by hand.)"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.manifest import Dataset
from pipeline.records import Record
from pipeline.schema import keys_of
from pipeline.source import SOURCES, Source, get_source
from pipeline.testing import Expected, SourceTypeContract, uncovered_source_types


class TestH5adType(SourceTypeContract):
    source_type = "h5ad"


class TestH5csrType(SourceTypeContract):
    source_type = "h5csr"


class TestDatType(SourceTypeContract):
    source_type = "dat"


class TestNpyType(SourceTypeContract):
    source_type = "npy"


class TestNiftiType(SourceTypeContract):
    source_type = "nifti"


class TestNrrdType(SourceTypeContract):
    source_type = "nrrd"


class TestDicomType(SourceTypeContract):
    source_type = "dicom"
    folders = True


TOY = [
    {"group": "a", "vec": [0.5, -1.25, 2.0, 0.1], "tokens": [3, 49], "skip": False},
    {"group": "b", "vec": [1.0, 2.0, 3.0, 4.0], "tokens": [], "skip": True},
    {"group": "a", "vec": [-0.3, 0.0, 7.5, 1e-3], "tokens": [0], "skip": False},
]


class TestToyType(SourceTypeContract):
    """The source type defined only in the tests (tests/plugin_toy.py), with its reading checked
    against the file's JSON read by hand."""

    source_type = "toy"

    @pytest.fixture
    def cls(self) -> type[Source]:
        import tests.plugin_toy  # noqa: F401  (registers "toy")

        return get_source(self.source_type)

    def sample_file(self, folder: Path) -> Path:
        path = folder / "one.toy"
        path.write_text(json.dumps({"records": TOY}))
        return path

    def expected_records(self, path: Path) -> Expected:
        records = json.loads(path.read_text())["records"]
        return [
            (
                Record(i, r["group"], (i,)),
                None
                if r["skip"]
                else {
                    "vec": np.array(r["vec"], np.float32),
                    "tokens": np.array(r["tokens"], np.int32),
                },
            )
            for i, r in enumerate(records)
        ]


def _covered() -> set[str]:
    def subclasses(c: type) -> list[type]:
        return [d for s in c.__subclasses__() for d in (s, *subclasses(s))]

    # here and in the test modules defining sources that this process imported
    return {getattr(c, "source_type", "") for c in subclasses(SourceTypeContract)}


def test_every_registered_type_has_a_contract() -> None:
    import tests.plugin_toy  # noqa: F401

    missing = uncovered_source_types(_covered(), prefixes=("pipeline", "tests"))
    assert not missing, f"source types without a SourceTypeContract subclass: {missing}"


def test_the_check_covers_entry_point_plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source type registered by an installed modality's build module (an entry point's
    ``BUILD_MODULE``, outside this repository) is held to the same rule."""
    import loaders.plugins

    (tmp_path / "outside_reader.py").write_text('BUILD_MODULE = "outside_builder"\n')
    (tmp_path / "outside_builder.py").write_text(
        "from pipeline.source import Source, register_source\n\n\n"
        "@register_source\nclass Untested(Source):\n"
        "    type, kinds, suffixes = 'untested_outside', ('toyvec',), ('.untested',)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("outside_builder")  # registered, by no installed modality yet
        before = uncovered_source_types(_covered(), prefixes=("pipeline", "tests"))
        faked = (*loaders.plugins.modality_modules(), ("outside", "outside_reader"))
        monkeypatch.setattr(loaders.plugins, "modality_modules", lambda: faked)
        after = uncovered_source_types(_covered(), prefixes=("pipeline", "tests"))
        assert set(after) - set(before) == {"untested_outside"}, (before, after)
    finally:
        del SOURCES["untested_outside"]
        for m in ("outside_reader", "outside_builder"):
            sys.modules.pop(m, None)


def test_the_manifest_keeps_no_list_of_source_types() -> None:
    import pipeline.manifest as manifest

    names = {n for n, v in vars(manifest).items() if isinstance(v, (tuple, list, set, frozenset))}
    assert all(
        not isinstance(v, str) or v not in SOURCES  # the manifest asks the source registry
        for n in names
        for v in getattr(manifest, n)
    )
    assert "plugins" in keys_of(Dataset)
