"""Conformance tests for source types, shipped with the package so that a plug-in outside this
repository can subclass them (the way zarr ships ``zarr.testing.StoreTests`` for third-party
stores).

Only test suites import this module: it imports pytest, and no product code may import it. A
subclass of :class:`SourceTypeContract` sets ``source_type`` (after importing the module that
registers it) and may override :meth:`SourceTypeContract.sample_file` and
:meth:`SourceTypeContract.expected_records` to check what its record kind reads against values
computed independently of the code under test."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from loaders.testing import in_modules, modality_module_names
from pipeline.manifest import load_manifest
from pipeline.model import get_kind
from pipeline.records import Record, RecordKind, SkipRecord
from pipeline.source import SOURCES, Source, get_source, infer_type, source_types_for

Expected = list[tuple[Record, Mapping[str, np.ndarray] | None]]


class SourceTypeContract:
    """What the registry needs of every source type, whatever it reads: registered under its type,
    feeding registered kinds, claiming suffixes the manifest can infer it from, expanding a named
    file to itself; and, given a reference, read by its record kinds as the reference says."""

    source_type: ClassVar[str]
    manifest_tables: ClassVar[str] = ""  # TOML added to the test manifest (a kind's section)
    folders: ClassVar[bool] = False  # it reads folders (a DICOM series): claims no suffix

    def sample_file(self, folder: Path) -> Path | None:
        """Override: write one small valid file of this type into ``folder`` and return its path."""
        return None

    def expected_records(self, path: Path) -> Expected | None:
        """Override: what a record kind of this source finds in ``path`` (from
        :meth:`sample_file`), computed independently of the code under test (by hand, or with
        another reader): each record, compared on (index, group, order, split), with its values by
        field (compared exactly, after a cast to the expected array's dtype as the shard column
        would be) or None when ``read_record`` must skip it. The default, None, skips the test that
        uses it."""
        return None

    @pytest.fixture
    def cls(self) -> type[Source]:
        return get_source(self.source_type)

    def test_registered_under_its_type(self, cls: type[Source]) -> None:
        assert issubclass(cls, Source) and cls.type == self.source_type
        assert SOURCES[self.source_type] is cls

    def test_feeds_registered_kinds(self, cls: type[Source]) -> None:
        assert cls.kinds and all(isinstance(k, str) for k in cls.kinds)
        for kind in cls.kinds:
            assert get_kind(kind).name == kind
            assert self.source_type in source_types_for(kind)

    def test_declarations_are_plain_names(self, cls: type[Source]) -> None:
        assert cls.suffixes or self.folders, "no suffixes (a type reading folders: folders = True)"
        assert all(x.startswith(".") and x == x.lower() for x in cls.suffixes)
        assert all(isinstance(o, str) and o not in ("path", "type") for o in cls.options)
        assert all(isinstance(f, str) and f for f in cls.produces)

    def test_a_manifest_without_type_infers_it_from_the_suffix(self, cls: type[Source]) -> None:
        for kind in cls.kinds:
            for suffix in cls.suffixes:
                rivals = [t for t in source_types_for(kind) if suffix in get_source(t).suffixes]
                # ambiguity is never guessed
                want = self.source_type if rivals == [self.source_type] else None
                assert infer_type(f"data/part{suffix}", kind) == want
                assert infer_type(f"data/PART{suffix.upper()}", kind) == want
            assert infer_type("data/part.no-such-suffix", kind) is None

    def test_expand_keeps_a_named_file(self, cls: type[Source], tmp_path: Path) -> None:
        if not cls.suffixes:
            pytest.skip(f"{self.source_type!r} reads folders: how it expands one is its own test")
        f = tmp_path / f"one{cls.suffixes[0]}"
        f.write_bytes(b"")
        assert cls.expand(f) == [f]

    def test_records_match_the_reference(self, cls: type[Source], tmp_path: Path) -> None:
        path = self.sample_file(tmp_path)
        want = None if path is None else self.expected_records(path)
        if want is None:
            pytest.skip(f"{type(self).__name__} has no sample_file/expected_records")
        kinds = [k for k in cls.kinds if isinstance(get_kind(k), RecordKind)]
        if not kinds:
            pytest.skip(f"{self.source_type!r} feeds no record kind (its kinds test reading)")
        for name in kinds:
            kind: Any = get_kind(name)
            manifest = load_manifest(self._manifest(path, name))
            spec = manifest.sources[0]
            # the plan's own sequence: scan (metadata), prepare (dataset-wide facts), then read
            scanned = [(0, r) for r in kind.scan_source(manifest, spec)]
            found = [r for _, r in kind.prepare(manifest, scanned)]
            assert [_identity(r) for r in found] == [_identity(r) for r, _ in want], name
            for record, (_, values) in zip(found, want, strict=True):
                if values is None:
                    with pytest.raises(SkipRecord):
                        kind.read_record(manifest, spec, record)
                    continue
                got, _meta = kind.read_record(manifest, spec, record)
                assert sorted(got) == sorted(values), f"{name}: record {record.index}'s fields"
                for field, value in values.items():
                    value = np.asarray(value)
                    cast = np.asarray(got[field]).astype(value.dtype)
                    np.testing.assert_array_equal(
                        cast, value, strict=True, err_msg=f"{name}: {field} of {record}"
                    )

    def _manifest(self, path: Path, kind: str) -> Path:
        text = (
            f'[dataset]\nname = "contract"\nkind = "{kind}"\n\n'
            f'[[sources]]\npath = "{path.name}"\ntype = "{self.source_type}"\n\n'
            f"{self.manifest_tables}\n"
        )
        manifest = path.parent / "contract.toml"
        manifest.write_text(text)
        return manifest


def _identity(r: Record) -> tuple[Any, ...]:
    return r.index, r.group, tuple(r.order), r.split


def uncovered_source_types(
    covered: Iterable[str], prefixes: Iterable[str] = ("pipeline",)
) -> list[str]:
    """Registered source types defined in ``prefixes`` or in an installed modality (its loader
    module or its ``BUILD_MODULE``) that are not among ``covered`` (types with a SourceTypeContract
    subclass)."""
    where = (*prefixes, *modality_module_names(build=True))
    ours = {t for t, c in SOURCES.load_all().items() if in_modules(c.__module__, where)}
    return sorted(ours - set(covered))
