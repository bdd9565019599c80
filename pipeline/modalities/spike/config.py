"""The spike kind's manifest sections: ``[spike]`` and ``[split]``, typed and validated into
:class:`SpikeConfig` (the ``[spike] codec`` choices are :mod:`.codecs`'s table).

Why a module of its own: what a manifest may say is settled once, when the manifest loads, and
needs none of the kind's scan, plan or read machinery; the kind (:mod:`.kind`) only reads the
resulting config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.errors import ManifestError
from pipeline.extras import MissingExtraError, require
from pipeline.modalities.spike.codecs import SPIKE_CODECS
from pipeline.modalities.spike.dat import PACKINGS
from pipeline.schema import key

LAYOUTS = ("files", "gopro")


def _frames(v: int | str) -> int | str | None:
    return None if v == "all" else v


@dataclasses.dataclass(frozen=True)
class SpikeSplit:
    """[split] of a spike manifest (records of one sequence stay together)."""

    val_fraction: float = key("number", 0.1, convert=float)
    test_fraction: float = key("number", 0.1, convert=float)


@dataclasses.dataclass(frozen=True)
class SpikeConfig:
    """[spike]: the camera's frames and how records are cut from them."""

    height: int = key("integer", minimum=1, doc="pixels; not in the file: always say it")
    width: int = key("integer", minimum=1, doc="pixels")
    packing: str = key("string", "bits", choices=PACKINGS, doc="how a .dat packs pixels")
    flip_rows: bool = key("boolean", True, doc="frames stored upside down by the camera")
    frames: int | None = key(
        ("integer", "string"), 40, convert=_frames, doc='central frames, or "all"'
    )
    num_bins: int = key("integer", 5, minimum=1, doc="voxel bins (divides frames)")
    layout: str = key("string", "files", choices=LAYOUTS, doc='"gopro": splits from the folders')
    images: tuple[str, ...] = key("names", (), doc='paired images (layout = "gopro")')
    clip_len: int = key("integer", 1, minimum=1, doc="frames per unit")
    codec: str = key("string", "spikebits", choices=tuple(SPIKE_CODECS))
    val_fraction: float = 0.1  # [split]
    test_fraction: float = 0.1


def parse_sections(path: Path, sections: Mapping[str, Any]) -> SpikeConfig:
    """The checked ``[spike]`` and ``[split]`` tables and the rules between their keys."""
    cfg = SpikeConfig(**sections["spike"], **sections["split"])
    if cfg.frames is not None and (not isinstance(cfg.frames, int) or cfg.frames < 1):
        raise ManifestError(
            path, "spike.frames", f'must be a positive integer or "all", got {cfg.frames!r}'
        )
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
