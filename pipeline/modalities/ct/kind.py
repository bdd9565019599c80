"""Dataset kind ``ct``: CT volumes (``.npy``, NIfTI, NRRD, DICOM series) -> one record of sparse
voxels each.

Manifest (docs/CT.md has every key)::

    [dataset]
    kind = "ct"
    [[sources]]
    path = "scans/*.npy"        # or a folder; the type is inferred from the suffix (.npy,
                                # .nii[.gz], .nrrd, .nhdr); a DICOM series folder: type = "dicom"
    [ct]                        # what a record keeps: pipeline.modalities.ct.volume.CtSettings (all
    keys optional)
    window = "lung"
    band = [-1000, -400]
    [split]                     # volumes drawn into val/test per group (a file, or a patient's
    folder)
    val_fraction = 0.1
    test_fraction = 0.1
    group = "file"              # or "folder": every volume of one folder in the same split

A record: ``coords`` ragged uint16 ``[k, 3]``, the features asked for (ragged ``hu`` int16,
``window`` float16), ``volume_shape`` int32 ``[3]`` and ``sample_id`` (the volume's position
among the sources, in sorted glob order). Per record, ``index.json`` keeps
(``sections.ct.records[shard]``) the file name, grid shape, geometry (spacing, origin, direction
in RAS mm), point count and what was kept, so the loader plans budget batches (and returns
geometry) from the index alone and ``inspect`` reports the fraction kept. A volume with fewer
than ``min_points`` points is skipped, counted under its reason in ``stats.skipped`` and logged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders import format as fmt
from loaders.modalities.ct.crop import first_unordered
from loaders.modalities.ct.samples import COORDS, FEATURES, KIND, POINTS, RECORDS, SHAPE
from pipeline.modalities.ct.formats import VolumeSource
from pipeline.modalities.ct.mask import grid_for
from pipeline.modalities.ct.settings import CtConfig, parse_sections
from pipeline.modalities.ct.volume import CtSettings, process_array, process_volume
from pipeline.model import register_kind
from pipeline.records import Record, RecordKind, SkipRecord
from pipeline.source import get_source

if TYPE_CHECKING:
    from pipeline.manifest import Manifest, SourceSpec
    from pipeline.model import ScannedSource

EMPTY_MASK = "empty body mask"
TOO_FEW = "fewer points than min_points"
NOT_CT = "not a CT series"
GEOMETRY_KEYS = ("file", "format", "shape", "spacing", "origin", "direction", "axes", "sample_id")
GEOMETRY_SHOWN = 8  # volumes whose geometry the text of `inspect` lists
ESTIMATED_KEEP = (
    0.15  # fraction of a grid's voxels a record is assumed to keep, to size shards before reading
)


@register_kind
class CtKind(RecordKind):
    name = KIND
    section_types = {"ct": CtSettings, "split": CtConfig}
    samples = (KIND,)

    def parse(self, path: Path, sections: Mapping[str, Any]) -> CtConfig:
        return parse_sections(path, sections)

    def fractions(self, config: CtConfig) -> tuple[float, float]:
        return config.val_fraction, config.test_fraction

    def scan_source(self, manifest: Manifest, spec: SourceSpec) -> list[Record]:
        header = _source(spec, manifest).header()
        cfg: CtConfig = manifest.config
        st = cfg.settings
        grid = header.shape
        spacing = header.geometry.spacing
        if st.resolution is not None or (st.spacing_mm is not None and spacing is not None):
            grid = grid_for(grid, st.resolution, spacing, st.spacing_mm)[0]
        points = int(np.prod(grid) * ESTIMATED_KEEP)
        if st.max_points is not None:
            points = min(points, st.max_points)
        per_point = 6 + sum(np.dtype(FEATURES[f]).itemsize for f in st.features)
        group = _stem(spec.path) if cfg.group == "file" else spec.path.parent.name
        # .npy: the info (so the shard keys) its builds had before the other formats came
        info = (
            {"shape": list(header.shape), "dtype": header.dtype}
            if header.format == "npy"
            else header.record_info()
        )
        return [Record(0, group, (spec.path.name,), nbytes=points * per_point, info=info)]

    def input_files(self, manifest: Manifest) -> list[Path]:
        """An ``.nhdr``'s data file: the voxels live there, so the no-change check must see it
        change."""
        out = []
        for spec in manifest.sources:
            if spec.type == "nrrd" and spec.path.suffix.lower() == ".nhdr":
                out.extend(_source(spec, manifest).header().companions)
        return out

    def schema(
        self, manifest: Manifest, scanned: Sequence[ScannedSource]
    ) -> tuple[fmt.FieldSpec, ...]:
        feats = manifest.config.settings.features
        return (
            fmt.FieldSpec(fmt.SAMPLE_ID, "dense", "int64"),
            fmt.FieldSpec(COORDS, "ragged", "uint16", (3,)),
            fmt.FieldSpec(SHAPE, "dense", "int32", (3,)),
            *(fmt.FieldSpec(f, "ragged", FEATURES[f]) for f in feats),
        )

    def read_record(
        self, manifest: Manifest, spec: SourceSpec, record: Record
    ) -> tuple[dict[str, np.ndarray], Any]:
        settings: CtSettings = manifest.config.settings
        if spec.type == "npy":
            rec, header = process_volume(spec.path, settings, seed=manifest.seed), None
        else:
            src = _source(spec, manifest)
            header = src.header()
            if header.skip:
                raise SkipRecord(NOT_CT, header.skip)
            opened = src.open(header)
            rec = process_array(
                opened.array,
                spec.path,
                settings,
                manifest.seed,
                header.shape,
                header.dtype,
                opened.geometry,
                opened.clipped,
            )
        reason = rec.skip_reason(settings)
        if reason is not None:
            raise SkipRecord(EMPTY_MASK if rec.body_voxels == 0 else TOO_FEW, reason)
        values = {COORDS: rec.coords, SHAPE: np.asarray(rec.shape, np.int32), **rec.features}
        g = rec.geometry.to_json()
        meta = {
            "file": spec.path.name,
            "shape": list(rec.shape),
            POINTS: rec.points,
            "kept": rec.kept,
            "voxels": rec.voxels,
            "body_voxels": rec.body_voxels,
            "spacing": g["spacing"],
            "origin": g["origin"],
            "source_shape": list(rec.source_shape),
            "source_dtype": rec.source_dtype,
            "clipped": rec.clipped,
            "format": spec.type,
            "direction": g["direction"],
            "space": g["space"],
            "axes": g["axes"],
            "sample_id": _ordinal(manifest, spec),
        }
        if header is not None and header.facts:
            meta["header"] = dict(header.facts)
        return values, meta

    def section(self, manifest: Manifest) -> dict[str, Any]:
        cfg: CtConfig = manifest.config
        return {
            "settings": settings_json(cfg.settings),
            "features": list(cfg.settings.features),
            "feature_dtypes": {f: FEATURES[f] for f in cfg.settings.features},
            "group": cfg.group,
        }

    def check_shard(self, index: fmt.Index, columns: Mapping[str, np.ndarray]) -> list[str]:
        off, xyz, shapes = columns[f"{COORDS}/offsets"], columns[f"{COORDS}/values"], columns[SHAPE]
        b = np.repeat(np.arange(shapes.shape[0]), np.diff(off))
        problems = []
        if xyz.size and np.any(xyz >= shapes[b]):
            problems.append(
                f"coordinates outside their volume's shape (record {int(b[np.any(xyz >= shapes[b], 1)][0])})"
            )
        bad = first_unordered(xyz, off)
        if bad is not None:
            problems.append(f"record {bad}'s coordinates are not in argwhere order (x, y, z)")
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
        formats: dict[str, int] = {}
        for r in recs:
            formats[str(r.get("format", "npy"))] = formats.get(str(r.get("format", "npy")), 0) + 1
        return {
            "volumes": len(recs),
            "formats": formats,
            "geometry": sorted(
                ({k: r.get(k) for k in GEOMETRY_KEYS} for r in recs),
                key=lambda g: (g["sample_id"] is None, g["sample_id"] or 0),
            ),
            "points": points,
            "voxels": voxels,
            "fraction_kept": kept / voxels if voxels else 0.0,
            "fraction_stored": points / voxels if voxels else 0.0,
            "points_per_volume": [min(counts, default=0), max(counts, default=0)],
            "subsampled": sum(int(r["kept"]) > int(r[POINTS]) for r in recs),
            "source_dtypes": sorted({str(r["source_dtype"]) for r in recs}),
            "settings": index.section(KIND).get("settings", {}),
        }

    def describe_lines(self, summary: Mapping[str, Any]) -> list[str]:
        s = summary.get("settings", {})
        lo, hi = (
            s.get("level", 0) - s.get("width", 0) / 2,
            s.get("level", 0) + s.get("width", 0) / 2,
        )
        lines = [
            f"  volumes: {summary['volumes']}, points: {summary['points']:,} of {summary['voxels']:,} voxels",
            f"  kept: {100 * summary['fraction_kept']:.2f}% of voxels (window {s.get('window')} [{lo:g}, {hi:g}]"
            f" HU, band {s.get('band')}, body mask {s.get('body_mask')}); stored after max_points: "
            f"{100 * summary['fraction_stored']:.2f}% ({summary['subsampled']} volumes subsampled)",
            f"  points per volume: {summary['points_per_volume'][0]:,} .. {summary['points_per_volume'][1]:,}; "
            f"source dtypes: {', '.join(summary['source_dtypes'])}",
        ]
        formats = summary.get("formats") or {}
        geo = summary.get("geometry") or []
        if formats:
            by = ", ".join(f"{k} {v}" for k, v in sorted(formats.items()))
            lines.append(
                f"  sources by format: {by}; axes {s.get('orientation') or 'as stored'}; "
                "geometry in RAS mm"
                + (" (all of it: inspect --json)" if len(geo) > GEOMETRY_SHOWN else "")
            )
        for g in geo[:GEOMETRY_SHOWN]:
            d = g.get("direction")
            oblique = d is not None and any(abs(x) not in (0.0, 1.0) for r in d for x in r)
            lines.append(
                f"    {g['file']} ({g.get('format') or 'npy'}): shape {g['shape']}, axes "
                f"{g.get('axes') or '-'}, spacing {_fmt(g.get('spacing'))} mm, origin "
                f"{_fmt(g.get('origin'))}" + (f", direction {_fmt(d)} (oblique)" if oblique else "")
            )
        return lines


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, list) and v and isinstance(v[0], list):
        return "[" + ", ".join(_fmt(r) for r in v) + "]"
    return "[" + ", ".join(f"{float(x):.4g}" for x in v) + "]"


def _stem(path: Path) -> str:
    """A volume's name without its format's suffix (``chest.nii.gz`` -> ``chest``; a DICOM folder:
    its name)."""
    name = path.name
    for suffix in (".nii.gz", ".nii", ".nrrd", ".nhdr", ".npy"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name if path.is_dir() else path.stem


def _source(spec: SourceSpec, manifest: Manifest) -> VolumeSource:
    cls = get_source(spec.type)
    src: VolumeSource = cls(spec.path, **dict(spec.options))  # type: ignore[assignment]
    src.allow_outside_data = manifest.config.settings.allow_outside_data
    return src


_ORDINALS: list[Any] = [None, {}]  # the last manifest's sources tuple and path -> position


def _ordinal(manifest: Manifest, spec: SourceSpec) -> int:
    """The volume's ``sample_id``: its position among the manifest's sources (one dict per
    manifest)."""
    sources, where = _ORDINALS
    if sources is not manifest.sources:
        where = {s.path: i for i, s in enumerate(manifest.sources)}
        _ORDINALS[:] = [manifest.sources, where]
    return int(where[spec.path])


# keys added after the first CT builds (NIfTI/NRRD/DICOM: spacing_mm, orientation; .nhdr:
# allow_outside_data): in index.json only when set, so the settings of a build using none read as before
ADDED = ("spacing_mm", "orientation", "allow_outside_data")


def settings_json(s: CtSettings) -> dict[str, Any]:
    """The ``[ct]`` settings as index.json ``sections.ct.settings`` holds them (tuples as lists)."""
    out = {f.name: getattr(s, f.name) for f in fields(s)}
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
    return {k: v for k, v in out.items() if k not in ADDED or v}


def settings_from_json(d: Mapping[str, Any]) -> CtSettings:
    """The inverse of :func:`settings_json` (lists back to tuples; absent added keys: unset)."""
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return CtSettings(**{k: v for k, v in kw.items() if k in CtSettings.__dataclass_fields__})
