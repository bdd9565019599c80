"""The ``spike`` kind: spike-camera ``.dat`` streams -> bit-packed spike windows (+ paired images)
per record.

One record = one spike window: the central ``frames`` frames of one ``.dat`` (from ``(T - frames)
// 2``), stored bit-packed as the camera writes them (1/8 of a byte per pixel; the loader makes
voxel grids, clips and crops), with its sequence and frame, and the paired images of a
GoPro-style layout (``<root>/<split>/<sequence>/{spike,blur,sharp}/<frame>.*``). Splits come from
the layout's ``train/``/``test/`` folders when present, else from the manifest's fractions drawn
per sequence: frames of one sequence never cross splits. Clips (``clip_len`` consecutive frames
of one sequence, stride 1) are a shard table. The manifest's ``[spike]`` / ``[split]`` settings
are parsed in
:mod:`pipeline.modalities.spike.config`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders import format as fmt
from loaders.modalities.spike.ops import PIXEL_MAJOR, pack_pixel_major
from loaders.modalities.spike.samples import CLIPS, FRAME, SEQUENCE, SPIKES, stored_frames
from pipeline.errors import ManifestError, SourceError
from pipeline.modalities.spike.checks import frame_facts, frame_warnings
from pipeline.modalities.spike.codecs import BITS, SPIKE_CODECS
from pipeline.modalities.spike.config import SpikeConfig, SpikeSplit, parse_sections
from pipeline.modalities.spike.dat import count_frames, pack_frames, read_frames
from pipeline.modalities.spike.tree import (
    IMAGE_SUFFIXES,
    SPLIT_FOLDERS,
    frame_key,
    read_image,
    unpaired_images,
)
from pipeline.model import KindPlan, PlanContext, register_kind
from pipeline.records import Record, RecordKind, SkipRecord

if TYPE_CHECKING:
    from pipeline.manifest import Manifest, SourceSpec
    from pipeline.model import ScannedSource

log = logging.getLogger(__name__)
UNSERVED = (
    "records_in_no_clip",
    "clips_lost_at_shard_cuts",
    "images_without_spikes",
    "sequences_without_spikes",
)


@register_kind
class SpikeKind(RecordKind):
    name = "spike"
    section_types = {"spike": SpikeConfig, "split": SpikeSplit}
    samples = ("spike",)
    _shapes: dict[str, tuple[int, ...]] = {}
    _window: int | None = None  # frames of a stored window (set by schema; "all": the first file's)

    def parse(self, path: Path, sections: Mapping[str, Any]) -> SpikeConfig:
        return parse_sections(path, sections)

    def fractions(self, config: SpikeConfig) -> tuple[float, float]:
        return config.val_fraction, config.test_fraction

    def scan_source(self, manifest: Manifest, spec: SourceSpec) -> list[Record]:
        cfg: SpikeConfig = manifest.config
        total = count_frames(spec.path, cfg.height, cfg.width, cfg.packing)
        keep = total if cfg.frames is None else cfg.frames
        info: dict[str, Any] = {
            "frames": total,
            "start": max(0, (total - keep) // 2),
            "frame_no": 0,
        }
        if cfg.layout == "files":
            return [
                Record(
                    0, spec.path.stem, (0,), nbytes=keep * cfg.height * cfg.width // 8, info=info
                )
            ]
        parts = spec.path.parts
        if len(parts) < 4 or parts[-2] != "spike":
            raise SourceError(
                spec.path, 'layout = "gopro" expects <root>/<split>/<sequence>/spike/<frame>.dat'
            )
        seq_dir, split = spec.path.parent.parent, SPLIT_FOLDERS.get(parts[-4].lower())
        group = f"{parts[-4]}/{parts[-3]}" if split else parts[-3]
        key = frame_key(spec.path.stem)
        info["frame_no"] = key[0]
        info["images"] = {
            name: next(
                (
                    str(p)
                    for s in IMAGE_SUFFIXES
                    if (p := seq_dir / name / f"{spec.path.stem}{s}").is_file()
                ),
                None,
            )
            for name in cfg.images
        }
        return [
            Record(0, group, key, split=split, nbytes=keep * cfg.height * cfg.width // 8, info=info)
        ]

    def source_companions(self, manifest: Manifest, spec: SourceSpec) -> list[Path]:
        """A frame's paired images (``<sequence>/<image folder>/<frame>.<suffix>``, every suffix
        :meth:`scan_source` looks for): adding, editing or removing one rewrites its shard."""
        seq_dir = spec.path.parent.parent
        return [
            seq_dir / name / f"{spec.path.stem}{suffix}"
            for name in manifest.config.images
            for suffix in IMAGE_SUFFIXES
        ]

    def prepare(
        self, manifest: Manifest, records: list[tuple[int, Record]]
    ) -> list[tuple[int, Record]]:
        """Sequence codes, and frame numbers: the files' numbers when every file of the sequence is
        named by one (``000047.dat``), else each file's position in its sequence sorted by name,
        so that clips (runs of consecutive numbers) form either way."""
        vocab = {g: i for i, g in enumerate(sorted({r.group for _, r in records}))}
        unnumbered = {r.group for _, r in records if r.info.get("frame_no", 0) < 0}
        position = {
            id(r): i
            for g in unnumbered
            for i, r in enumerate(
                sorted((r for _, r in records if r.group == g), key=lambda r: r.order)
            )
        }
        out = []
        for src, r in records:
            info = {**r.info, "seq": vocab[r.group]}
            if r.group in unnumbered:
                info["frame_no"] = position[id(r)]
            out.append((src, dataclasses.replace(r, info=info)))
        return out

    def plan(
        self, manifest: Manifest, scanned: Sequence[ScannedSource], ctx: PlanContext
    ) -> KindPlan:
        plan = super().plan(manifest, scanned, ctx)
        plan.vocabularies = {SEQUENCE: sorted({r.group for s in scanned for r in s.meta})}
        cfg: SpikeConfig = manifest.config
        facts = frame_facts(
            [(r.group, s.spec.path, int(r.info["frames"])) for s in scanned for r in s.meta],
            cfg.height,
            cfg.width,
            cfg.packing,
        )
        plan.stats.update(facts)
        for line in frame_warnings(facts):
            log.warning("%s: %s", manifest.path, line)
        if manifest.config.layout == "gopro":
            plan.stats.update(unpaired_images(manifest, [s.spec.path for s in scanned]))
        if (
            manifest.config.clip_len > 1
        ):  # clips are per shard: count those a shard cut splits (never silent)
            per_split: dict[str, list[Record]] = {}
            kept = alone = 0
            for shard in plan.shards:
                recs = [plan.extra[int(k)][1] for k in shard.rows]
                per_split.setdefault(shard.split, []).extend(recs)
                clips = self.shard_tables(manifest, recs)[CLIPS]
                kept += len(clips)
                alone += len(recs) - np.unique(clips).size  # stored, but no unit reaches them
            lost = (
                sum(len(self.shard_tables(manifest, r)[CLIPS]) for r in per_split.values()) - kept
            )
            plan.stats["clips_lost_at_shard_cuts"] = lost
            plan.stats["records_in_no_clip"] = alone
            if lost:
                log.warning(
                    "%s: %d clips cross a shard cut and are not stored: raise [dataset] shard_size_mb "
                    "above the longest sequence's bytes to keep them",
                    manifest.path,
                    lost,
                )
            if alone:
                log.warning(
                    "%s: %d records are in no clip of %d consecutive frames (a frame gap, a sequence "
                    "shorter than clip_len, or a shard cut): stored, but the loader never gives them",
                    manifest.path,
                    alone,
                    manifest.config.clip_len,
                )
        return plan

    def _frames(self, manifest: Manifest, scanned: Sequence[ScannedSource]) -> int:
        cfg: SpikeConfig = manifest.config
        if cfg.frames is not None:
            return cfg.frames
        first = scanned[0]
        t = int(first.meta[0].info["frames"])
        if (
            t % cfg.num_bins
        ):  # "all" frames: checked here, the first time the window's length is known
            raise ManifestError(
                manifest.path,
                "spike.num_bins",
                f"{cfg.num_bins} does not divide the {t} frames "
                f'that frames = "all" stores ({first.spec.path}): every default load would '
                "fail; set num_bins to a divisor or frames to a multiple of it",
            )
        return t

    def _image_shapes(
        self, manifest: Manifest, scanned: Sequence[ScannedSource]
    ) -> dict[str, tuple[int, ...]]:
        import PIL.Image  # optional extra images

        shapes: dict[str, tuple[int, ...]] = {}
        for name in manifest.config.images:
            first = next(
                (
                    r.info["images"][name]
                    for s in scanned
                    for r in s.meta
                    if r.info["images"].get(name)
                ),
                None,
            )
            if first is None:
                raise ManifestError(
                    manifest.path, "spike.images", f"no {name!r} image found next to any spike file"
                )
            with PIL.Image.open(first) as im:
                shapes[name] = (1 if im.mode in ("L", "1", "I;16") else 3, im.height, im.width)
        return shapes

    def schema(
        self, manifest: Manifest, scanned: Sequence[ScannedSource]
    ) -> tuple[fmt.FieldSpec, ...]:
        cfg: SpikeConfig = manifest.config
        n_seq = len({r.group for s in scanned for r in s.meta})
        codec, order = SPIKE_CODECS[cfg.codec]
        self._window = t = self._frames(manifest, scanned)
        shape = (
            (cfg.height, cfg.width, -(-t // 8))
            if order == PIXEL_MAJOR
            else (t, cfg.height, -(-cfg.width // 8))
        )
        fields = [
            fmt.FieldSpec(fmt.SAMPLE_ID, "dense", "int64"),
            fmt.FieldSpec(SPIKES, "dense", "uint8", shape, codec=codec),
            fmt.FieldSpec(SEQUENCE, "dense", "int32", bound=n_seq),
            fmt.FieldSpec(FRAME, "dense", "int32"),
        ]
        fields += [
            fmt.FieldSpec(n, "dense", "uint8", s)
            for n, s in self._image_shapes(manifest, scanned).items()
        ]
        self._shapes = {
            f.name: f.shape for f in fields
        }  # what read_record checks each record against
        return tuple(fields)

    def tables(self, manifest: Manifest) -> tuple[str, ...]:
        return (CLIPS,) if manifest.config.clip_len > 1 else ()

    def read_record(
        self, manifest: Manifest, spec: SourceSpec, record: Record
    ) -> tuple[dict[str, np.ndarray], Any]:
        cfg: SpikeConfig = manifest.config
        keep = cfg.frames if cfg.frames is not None else int(record.info["frames"])
        if record.info["frames"] < keep:
            raise SkipRecord(
                "fewer frames than [spike] frames", f"{record.info['frames']} < {keep}"
            )
        if cfg.frames is None and keep != (self._window or keep):
            raise SkipRecord('frame count differs from the dataset\'s (frames = "all")')
        frames = read_frames(
            spec.path, cfg.height, cfg.width, cfg.packing, cfg.flip_rows, record.info["start"], keep
        )
        pack = pack_pixel_major if SPIKE_CODECS[cfg.codec][1] == PIXEL_MAJOR else pack_frames
        out: dict[str, np.ndarray] = {
            SPIKES: pack(frames),
            SEQUENCE: np.int32(record.info["seq"]),
            FRAME: np.int32(record.info["frame_no"]),
        }
        for name in cfg.images:
            path = record.info["images"].get(name)
            if path is None:
                raise SkipRecord(f"no {name} image for the spike frame", str(spec.path))
            out[name] = read_image(Path(path))
            if out[name].shape != self._shapes[name]:
                raise SkipRecord(
                    f"{name} image size differs from the dataset's", f"{path}: {out[name].shape}"
                )
        return out, {
            "sequence": record.group,
            "frame": record.info["frame_no"],
            "file": spec.path.name,
        }

    def shard_tables(self, manifest: Manifest, records: Sequence[Record]) -> dict[str, np.ndarray]:
        """Clips: every run of ``clip_len`` records of one sequence with consecutive frame numbers
        (stride 1)."""
        length, n = manifest.config.clip_len, len(records)
        if length <= 1:
            return {}
        seq = np.array([r.info["seq"] for r in records], np.int64)
        frame = np.array([r.info["frame_no"] for r in records], np.int64)
        step = (seq[1:] == seq[:-1]) & (frame[1:] == frame[:-1] + 1)
        ok = np.ones(max(n - length + 1, 0), bool)
        for j in range(length - 1):
            ok &= step[j : j + ok.size]
        starts = np.flatnonzero(ok)
        return {CLIPS: (starts[:, None] + np.arange(length)).astype(np.int32).reshape(-1, length)}

    def section(self, manifest: Manifest) -> dict[str, Any]:
        cfg: SpikeConfig = manifest.config
        return {
            "height": cfg.height,
            "width": cfg.width,
            "packing": cfg.packing,
            "flip_rows": cfg.flip_rows,
            "frames": cfg.frames,
            "num_bins": cfg.num_bins,
            "layout": cfg.layout,
            "images": list(cfg.images),
            "clip_len": cfg.clip_len,
            "codec": cfg.codec,
            "bit_order": (order := SPIKE_CODECS[cfg.codec][1]),
            "window_frames": self._window or cfg.frames,
            "bits": BITS[order],
        }

    def warnings(self, index: fmt.Index) -> list[str]:
        return [*super().warnings(index), *frame_warnings(index.stats)]

    def describe(self, index: fmt.Index) -> dict[str, Any]:
        sec = index.section()
        out = {
            **super().describe(index),
            "resolution": f"{sec.get('height')}x{sec.get('width')}",
            "frames": stored_frames(index),
            "num_bins": sec.get("num_bins"),
            "clip_len": sec.get("clip_len"),
            "images": sec.get("images"),
            "sequences": len(index.vocabularies.get(SEQUENCE, [])),
        }
        per_file = _per_file(index.stats.get("frames_per_file"))
        if per_file is not None:
            out["frames per file"] = per_file
        for key in (
            UNSERVED
        ):  # what the build counted but the loader never serves: shown only when it happened
            v = index.stats.get(key)
            if v and (not isinstance(v, dict) or any(v.values())):
                out[key.replace("_", " ")] = v
        return out


def _per_file(facts: Mapping[str, int] | None) -> str | None:
    """'301 (all 12 files)' or '40-301 over 12 files'; None for an index built before it was
    counted."""
    if not facts:
        return None
    lo, hi, n = facts["min"], facts["max"], facts["files"]
    return f"{lo} (all {n} files)" if lo == hi else f"{lo}-{hi} over {n} files"
