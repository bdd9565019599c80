"""Source type ``npy``: one CT volume per ``.npy`` file (feeds kind ``ct``).

A manifest path may name files (a glob) or folders: a folder stands for the ``.npy`` files
directly in it, sorted, so ``path = "scans/"`` and ``path = "scans/*.npy"`` list the same volumes
in the same order (the order that gives each volume its ``sample_id``). A ``<stem>.json`` beside
a volume is its sidecar (spacing, origin), not a source. Reading is
:mod:`pipeline.modalities.ct.volume` (memory-mapped, header checked, never unpickled).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.modalities.ct.formats import Opened, VolumeHeader, VolumeSource
from pipeline.modalities.ct.geometry import Geometry
from pipeline.modalities.ct.volume import VolumeInfo, inspect_volume, open_volume
from pipeline.source import register_source


@register_source
class NpySource(VolumeSource):
    type = "npy"
    format = "npy"
    suffixes = (".npy",)

    @classmethod
    def companions(cls, path: Path) -> list[Path]:
        """The sidecar: its spacing and origin are the record's geometry."""
        return [path.with_suffix(".json")]

    def info(self) -> VolumeInfo:
        """Shape, dtype and sidecar, from the header alone (SourceError naming the file on bad
        input)."""
        return inspect_volume(self.path)

    def header(self) -> VolumeHeader:
        info = self.info()
        geometry = Geometry(info.spacing, info.origin)
        return VolumeHeader(self.path, info.shape, info.dtype, geometry, self.format)

    def open(self, header: VolumeHeader) -> Opened:
        return Opened(open_volume(self.info()), header.geometry)
