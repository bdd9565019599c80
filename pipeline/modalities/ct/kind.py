"""Dataset kind ``ct``: a folder of CT ``.npy`` volumes -> one record of sparse voxels per volume.

Manifest (docs/CT.md has every key)::

    [dataset]
    kind = "ct"
    [[sources]]
    path = "scans/*.npy"        # or a folder; type "npy" is inferred from the suffix
    [ct]                        # what a record keeps: pipeline.modalities.ct.volume.CtSettings (all keys optional)
    window = "lung"
    band = [-1000, -400]
    [split]                     # volumes drawn into val/test per group (a file, or a patient's folder)
    val_fraction = 0.1
    test_fraction = 0.1
    group = "file"              # or "folder": every volume of one folder in the same split

A record: ``coords`` ragged uint16 ``[k, 3]``, the features asked for (ragged ``hu`` int16, ``window``
float16), ``volume_shape`` int32 ``[3]`` and ``sample_id`` (the volume's position among the sources, in
sorted glob order). Per record, ``index.json`` keeps (``sections.ct.records[shard]``) the file name, grid
shape, spacing, origin, point count and what was kept, so the loader plans budget batches from the index
alone and ``inspect`` reports the fraction of voxels kept. A volume with fewer than ``min_points`` points is
skipped, counted under its reason in ``stats.skipped`` and logged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders import format as fmt
from loaders.modalities.ct.samples import COORDS, FEATURES, KIND, POINTS, RECORDS, SHAPE
from pipeline.errors import ManifestError
from pipeline.manifest import Table
from pipeline.modalities.ct.npy import NpySource
from pipeline.modalities.ct.volume import CtSettings, process_volume
from pipeline.model import register_kind
from pipeline.records import Record, RecordKind, SkipRecord

if TYPE_CHECKING:
    from pipeline.manifest import Manifest, SourceSpec
    from pipeline.model import ScannedSource

EMPTY_MASK = "empty body mask"
TOO_FEW = "fewer points than min_points"
ESTIMATED_KEEP = 0.15  # fraction of a grid's voxels a record is assumed to keep, to size shards before reading


@dataclass(frozen=True)
class CtConfig:
    settings: CtSettings
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    group: str = "file"  # "file" | "folder": what must not cross splits


@register_kind
class CtKind(RecordKind):
    name = KIND
    sections = ("ct", "split")
    samples = (KIND,)

    def parse(self, path: Path, sections: Mapping[str, Any]) -> CtConfig:
        ct = sections.get("ct")
        settings = CtSettings.from_section(Table(path, "ct", {} if ct is None else ct, set(ct or {})).data, path)
        t = Table(path, "split", sections.get("split") or {}, {"val_fraction", "test_fraction", "group"})
        val = float(t.get("val_fraction", (int, float), 0.1))
        test = float(t.get("test_fraction", (int, float), 0.1))
        for key, v in (("val_fraction", val), ("test_fraction", test)):
            if not 0.0 <= v <= 1.0:
                raise ManifestError(path, f"split.{key}", f"must lie in [0, 1], got {v}")
        if val + test > 1.0:
            raise ManifestError(path, "split.test_fraction", f"val_fraction + test_fraction = {val + test} > 1")
        return CtConfig(settings, val, test, t.get("group", str, "file", ("file", "folder")))

    def fractions(self, config: CtConfig) -> tuple[float, float]:
        return config.val_fraction, config.test_fraction

    def scan_source(self, manifest: Manifest, spec: SourceSpec) -> list[Record]:
        info = NpySource(spec.path).info()
        cfg: CtConfig = manifest.config
        grid = info.shape
        if cfg.settings.resolution is not None:
            f = cfg.settings.resolution / max(grid)
            grid = tuple(max(1, int(round(n * f))) for n in grid)  # type: ignore[assignment]
        points = int(np.prod(grid) * ESTIMATED_KEEP)
        if cfg.settings.max_points is not None:
            points = min(points, cfg.settings.max_points)
        per_point = 6 + sum(np.dtype(FEATURES[f]).itemsize for f in cfg.settings.features)
        group = spec.path.stem if cfg.group == "file" else spec.path.parent.name
        return [Record(0, group, (spec.path.name,), nbytes=points * per_point,
                       info={"shape": list(info.shape), "dtype": info.dtype})]

    def schema(self, manifest: Manifest, scanned: Sequence[ScannedSource]) -> tuple[fmt.FieldSpec, ...]:
        feats = manifest.config.settings.features
        return (fmt.FieldSpec(fmt.SAMPLE_ID, "dense", "int64"), fmt.FieldSpec(COORDS, "ragged", "uint16", (3,)),
                fmt.FieldSpec(SHAPE, "dense", "int32", (3,)),
                *(fmt.FieldSpec(f, "ragged", FEATURES[f]) for f in feats))

    def read_record(self, manifest: Manifest, spec: SourceSpec, record: Record) -> tuple[dict[str, np.ndarray], Any]:
        settings: CtSettings = manifest.config.settings
        rec = process_volume(spec.path, settings, seed=manifest.seed)
        reason = rec.skip_reason(settings)
        if reason is not None:
            raise SkipRecord(EMPTY_MASK if rec.body_voxels == 0 else TOO_FEW, reason)
        values = {COORDS: rec.coords, SHAPE: np.asarray(rec.shape, np.int32), **rec.features}
        meta = {"file": spec.path.name, "shape": list(rec.shape), POINTS: rec.points, "kept": rec.kept,
                "voxels": rec.voxels, "body_voxels": rec.body_voxels, "spacing": _list(rec.spacing),
                "origin": _list(rec.origin), "source_shape": list(rec.source_shape),
                "source_dtype": rec.source_dtype, "clipped": rec.clipped}
        return values, meta

    def section(self, manifest: Manifest) -> dict[str, Any]:
        cfg: CtConfig = manifest.config
        return {"settings": cfg.settings.to_json(), "features": list(cfg.settings.features),
                "feature_dtypes": {f: FEATURES[f] for f in cfg.settings.features}, "group": cfg.group}

    def check_shard(self, index: fmt.Index, columns: Mapping[str, np.ndarray]) -> list[str]:
        off, xyz, shapes = columns[f"{COORDS}/offsets"], columns[f"{COORDS}/values"], columns[SHAPE]
        b = np.repeat(np.arange(shapes.shape[0]), np.diff(off))
        problems = []
        if xyz.size and np.any(xyz >= shapes[b]):
            problems.append(f"coordinates outside their volume's shape (record {int(b[np.any(xyz >= shapes[b], 1)][0])})")
        if "window/values" in columns:
            w = columns["window/values"].astype(np.float32)
            if w.size and (w.min() < 0 or w.max() > 1):
                problems.append("windowed values outside [0, 1]")
        return problems

    def describe(self, index: fmt.Index) -> dict[str, Any]:
        recs = [r for rs in (index.section(KIND).get(RECORDS) or {}).values() for r in rs]
        voxels = sum(int(r["voxels"]) for r in recs)
        points = sum(int(r[POINTS]) for r in recs)
        kept = sum(int(r["kept"]) for r in recs)
        counts = [int(r[POINTS]) for r in recs]
        return {"volumes": len(recs), "points": points, "voxels": voxels,
                "fraction_kept": kept / voxels if voxels else 0.0,
                "fraction_stored": points / voxels if voxels else 0.0,
                "points_per_volume": [min(counts, default=0), max(counts, default=0)],
                "subsampled": sum(int(r["kept"]) > int(r[POINTS]) for r in recs),
                "source_dtypes": sorted({str(r["source_dtype"]) for r in recs}),
                "settings": index.section(KIND).get("settings", {})}

    def describe_lines(self, summary: Mapping[str, Any]) -> list[str]:
        s = summary.get("settings", {})
        lo, hi = s.get("level", 0) - s.get("width", 0) / 2, s.get("level", 0) + s.get("width", 0) / 2
        return [f"  volumes: {summary['volumes']}, points: {summary['points']:,} of {summary['voxels']:,} voxels",
                f"  kept: {100 * summary['fraction_kept']:.2f}% of voxels (window {s.get('window')} [{lo:g}, {hi:g}]"
                f" HU, band {s.get('band')}, body mask {s.get('body_mask')}); stored after max_points: "
                f"{100 * summary['fraction_stored']:.2f}% ({summary['subsampled']} volumes subsampled)",
                f"  points per volume: {summary['points_per_volume'][0]:,} .. {summary['points_per_volume'][1]:,}; "
                f"source dtypes: {', '.join(summary['source_dtypes'])}"]


def _list(v: Sequence[float] | None) -> list[float] | None:
    return None if v is None else [float(x) for x in v]
