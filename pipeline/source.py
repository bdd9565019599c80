"""Input file types (``[[sources]] type``): the tiny base every source implements, and their
registry.

A modality registers its source types (lazily: its module is imported on first use); a manifest
that names no type gets the one source type of its kind claiming the file's suffix."""

from __future__ import annotations

from abc import ABC
from pathlib import Path
from typing import ClassVar

from loaders.plugins import load_build_modalities
from loaders.plugins.registry import Registry


class Source(ABC):
    """One input file of a registered *source type*. Opened lazily; never loads more than a bounded
    block.

    A source class declares what the registry needs to pick it without copied lists: its ``type``
    (the manifest's ``[[sources]] type``), the dataset ``kinds`` it feeds, the file ``suffixes``
    it claims (a manifest that names no type gets the one source type of its kind claiming the
    file's suffix), the extra ``[[sources]]`` keys it accepts (``options``) and the record fields
    it produces (``produces``, for docs and error messages). How records are read is the business
    of the interface its kinds use (:class:`MatrixSource` for perturbation; a record kind defines
    its own).
    """

    type: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]] = ()
    suffixes: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[tuple[str, ...]] = ()
    produces: ClassVar[tuple[str, ...]] = ()

    def __init__(self, path: str | Path, **options: object) -> None:
        self.path = Path(path)

    @classmethod
    def expand(cls, path: Path) -> list[Path]:
        """The input files a manifest path match stands for (a folder may stand for the files in
        it)."""
        return [path]

    @classmethod
    def companions(cls, path: Path) -> list[Path]:
        """Other files this source's records are read from (a sidecar, a detached data file),
        listed whether they exist or not: part of the source's fingerprint, so editing, adding or
        removing one rewrites this source's shards. Read cheaply (no voxels): every build asks."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release file handles (sources may keep a file open between reads)."""

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SOURCES: Registry[type[Source]] = Registry("source type", discover=load_build_modalities)


def register_source(cls: type[Source]) -> type[Source]:
    """Class decorator: make ``cls`` available as ``[[sources]] type = cls.type``."""
    if not getattr(cls, "type", None):
        raise TypeError(f"{cls.__name__} has no source type")
    SOURCES.register(cls.type, cls)
    return cls


def get_source(type_name: str) -> type[Source]:
    """The source class of ``type_name`` (only its module is imported: a CT source pulls in
    scipy.ndimage)."""
    return SOURCES.get(type_name)


def source_types_for(kind: str) -> list[str]:
    """The registered source types that feed dataset kind ``kind``."""
    return sorted(t for t, cls in SOURCES.items() if kind in cls.kinds)


def infer_type(path: str, kind: str) -> str | None:
    """The one source type of ``kind`` claiming ``path``'s suffix, or None (none or several claim
    it)."""
    hits = [t for t in source_types_for(kind) if str(path).lower().endswith(SOURCES[t].suffixes)]
    return hits[0] if len(hits) == 1 else None
