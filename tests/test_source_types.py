"""Every source type, whatever it reads, held to what the registry needs of it (``SourceTypeContract``):
registered under its type, feeding registered kinds, claiming suffixes the manifest can infer it from, and
expanding a named file to itself. A new source type subclasses the contract; the last test fails for a
registered type that has none. (Reading is tested per kind: matrix sources in test_sources.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.model import get_kind
from pipeline.manifest import DATASET_KEYS
from pipeline.source import SOURCES, Source, get_source, infer_type, source_types_for


class SourceTypeContract:
    """What the registry needs of every source type, whatever it reads: subclass with ``source_type`` set
    (after importing the module that registers it). `test_every_registered_type_has_a_contract` makes sure
    no registered type goes without one."""

    source_type: str

    @pytest.fixture
    def cls(self) -> type[Source]:
        return get_source(self.source_type)

    def test_registered_under_its_type(self, cls: type[Source]) -> None:
        assert issubclass(cls, Source) and cls.type == self.source_type and SOURCES[self.source_type] is cls

    def test_feeds_registered_kinds(self, cls: type[Source]) -> None:
        assert cls.kinds and all(isinstance(k, str) for k in cls.kinds)
        for kind in cls.kinds:
            assert get_kind(kind).name == kind
            assert self.source_type in source_types_for(kind)

    def test_declarations_are_plain_names(self, cls: type[Source]) -> None:
        assert cls.suffixes and all(x.startswith(".") and x == x.lower() for x in cls.suffixes)
        assert all(isinstance(o, str) and o not in ("path", "type") for o in cls.options)
        assert all(isinstance(f, str) and f for f in cls.produces)

    def test_a_manifest_without_type_infers_it_from_the_suffix(self, cls: type[Source]) -> None:
        for kind in cls.kinds:
            for suffix in cls.suffixes:
                rivals = [t for t in source_types_for(kind) if suffix in get_source(t).suffixes]
                want = self.source_type if rivals == [self.source_type] else None  # ambiguity is never guessed
                assert infer_type(f"data/part{suffix}", kind) == want
                assert infer_type(f"data/PART{suffix.upper()}", kind) == want
            assert infer_type("data/part.no-such-suffix", kind) is None

    def test_expand_keeps_a_named_file(self, cls: type[Source], tmp_path: Path) -> None:
        f = tmp_path / f"one{cls.suffixes[0]}"
        f.write_bytes(b"")
        assert cls.expand(f) == [f]


class TestH5adType(SourceTypeContract):
    source_type = "h5ad"


class TestH5csrType(SourceTypeContract):
    source_type = "h5csr"


class TestDatType(SourceTypeContract):
    source_type = "dat"


class TestNpyType(SourceTypeContract):
    source_type = "npy"


class TestToyType(SourceTypeContract):
    """The source type defined only in the tests (tests/plugin_toy.py), held to the same contract."""

    source_type = "toy"

    @pytest.fixture
    def cls(self) -> type[Source]:
        import tests.plugin_toy  # noqa: F401  (registers "toy")

        return get_source(self.source_type)


def test_every_registered_type_has_a_contract() -> None:
    import tests.plugin_toy  # noqa: F401

    SOURCES.load_all()
    def subclasses(c: type) -> list[type]:
        return [d for s in c.__subclasses__() for d in (s, *subclasses(s))]

    covered = {c.source_type for c in subclasses(SourceTypeContract)}  # here and in test modules defining sources
    ours = {t for t, c in SOURCES.items() if c.__module__.startswith(("pipeline.", "tests."))}  # not docs' examples
    assert ours <= covered, f"source types without a SourceTypeContract subclass: {ours - covered}"


def test_the_manifest_keeps_no_list_of_source_types() -> None:
    import pipeline.manifest as manifest

    names = {n for n, v in vars(manifest).items() if isinstance(v, (tuple, list, set, frozenset))}
    assert all(not isinstance(v, str) or v not in SOURCES
               for n in names for v in getattr(manifest, n)), "the manifest asks the source registry"
    assert "plugins" in DATASET_KEYS
