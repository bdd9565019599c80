"""The spike kind's manifest sections: ``[spike]`` and ``[split]``, typed and validated into
:class:`SpikeConfig`, and the ``[spike] codec`` choices (each one's column codec and bit order).

Why a module of its own: what a manifest may say is settled once, when the manifest loads, and
needs none of the kind's scan, plan or read machinery; the kind (:mod:`.kind`) only reads the
resulting config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loaders.modalities.spike.ops import FRAME_MAJOR, PIXEL_MAJOR
from pipeline.errors import ManifestError
from pipeline.extras import MissingExtraError, require
from pipeline.manifest import Table
from pipeline.modalities.spike.dat import PACKINGS

LAYOUTS = ("files", "gopro")
# [spike] codec -> (the spikes column's own codec, its bit order). "spikebits" (default): the window
# stored pixel-major (loaders.modalities.spike.ops) + zstd 5, ~0.55 of the bits' size, voxels by
# popcount; "spikebits-v1" (the previous default): frame-major column, the pixel-major transpose
# inside the codec (loaders.modalities.spike.bits), undone on every read; "dataset": frame-major
# with the [dataset] codec like every other column (e.g. "none"). The frame-major options keep the
# column as the camera writes it (and a plain "dataset" index at version 2).
SPIKE_CODECS: dict[str, tuple[dict[str, Any] | None, str]] = {
    "spikebits": ({"id": "zstd", "level": 5}, PIXEL_MAJOR),
    "spikebits-v1": ({"id": "shardsmith.spikebits", "level": 5}, FRAME_MAJOR),
    "dataset": (None, FRAME_MAJOR),
}
BITS = {
    PIXEL_MAJOR: "byte [y, x, k] = frames 8k..8k+7 of pixel (y, x), LSB first; rows top to bottom",
    FRAME_MAJOR: "1 bit per pixel, LSB first along width, rows top to bottom",
}


@dataclasses.dataclass(frozen=True)
class SpikeConfig:
    height: int
    width: int
    packing: str = "bits"
    flip_rows: bool = True
    frames: int | None = 40  # None: all
    num_bins: int = 5
    layout: str = "files"
    images: tuple[str, ...] = ()
    clip_len: int = 1
    codec: str = "spikebits"
    val_fraction: float = 0.1
    test_fraction: float = 0.1


def parse_sections(path: Path, sections: Mapping[str, Any]) -> SpikeConfig:
    """The ``[spike]`` and ``[split]`` tables of the manifest at ``path`` (``ManifestError`` naming
    the key on a bad value)."""
    t = Table(
        path,
        "spike",
        sections.get("spike") or {},
        {
            "height",
            "width",
            "packing",
            "flip_rows",
            "frames",
            "num_bins",
            "layout",
            "images",
            "clip_len",
            "codec",
        },
    )
    sp = Table(path, "split", sections.get("split") or {}, {"val_fraction", "test_fraction"})
    frames = t.get("frames", (int, str), 40)
    if frames != "all" and (not isinstance(frames, int) or frames < 1):
        raise ManifestError(
            path, "spike.frames", f'must be a positive integer or "all", got {frames!r}'
        )
    cfg = SpikeConfig(
        height=t.get("height", int),
        width=t.get("width", int),
        packing=t.get("packing", str, "bits", PACKINGS),
        flip_rows=t.get("flip_rows", bool, True),
        frames=None if frames == "all" else frames,
        num_bins=t.get("num_bins", int, 5),
        layout=t.get("layout", str, "files", LAYOUTS),
        images=t.names("images"),
        clip_len=t.get("clip_len", int, 1),
        codec=t.get("codec", str, "spikebits", tuple(SPIKE_CODECS)),
        val_fraction=float(sp.get("val_fraction", (int, float), 0.1)),
        test_fraction=float(sp.get("test_fraction", (int, float), 0.1)),
    )
    for key in ("height", "width", "num_bins", "clip_len"):
        if getattr(cfg, key) < 1:
            raise ManifestError(path, f"spike.{key}", "must be >= 1")
    if cfg.frames is not None and cfg.frames % cfg.num_bins:
        raise ManifestError(
            path, "spike.num_bins", f"{cfg.num_bins} does not divide frames = {cfg.frames}"
        )
    if cfg.images and cfg.layout != "gopro":
        raise ManifestError(path, "spike.images", 'paired images need layout = "gopro"')
    if cfg.images:
        try:
            require("PIL")
        except MissingExtraError as e:
            raise ManifestError(path, "spike.images", str(e)) from None
    return cfg
