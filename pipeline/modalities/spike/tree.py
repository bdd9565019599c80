"""The GoPro-style folder tree of a spike dataset (``<root>/<split>/<sequence>/{spike,blur,sharp}/
<frame>.*``): its split folders, frame keys and paired images, and what it holds that pairs with no
spike file (counted and logged by the kind, never silently dropped)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.modalities.spike.config import SpikeConfig
from pipeline.records import SkipRecord

if TYPE_CHECKING:
    from pipeline.manifest import Manifest

log = logging.getLogger(__name__)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
SPLIT_FOLDERS = {"train": "train", "val": "val", "valid": "val", "test": "test"}


def frame_key(stem: str) -> tuple[int, str]:
    """A frame file's sort key: numbered stems in number order, others after, by name."""
    return (int(stem), stem) if stem.isdigit() else (-1, stem)


def unpaired_images(manifest: Manifest, dats: list[Path]) -> dict[str, Any]:
    """A GoPro tree's images that no spike file pairs (per image folder), and the sequence folders
    beside the found ones that hold no spike file at all: not records, but issue 10's bad input,
    so counted and logged."""
    cfg: SpikeConfig = manifest.config
    stems: dict[Path, set[str]] = {}
    for dat in dats:
        stems.setdefault(dat.parent.parent, set()).add(dat.stem)
    empty = sorted(
        d
        for parent in {q.parent for q in stems}
        for d in parent.iterdir()
        if d.is_dir()
        and d not in stems
        and any((d / n).is_dir() for n in ("spike", *cfg.images))
        and not any((d / "spike").glob("*.dat"))
    )
    extra = {
        name: sorted(
            p
            for d in [*stems, *empty]
            if (d / name).is_dir()
            for p in (d / name).iterdir()
            if p.suffix.lower() in IMAGE_SUFFIXES and p.stem not in stems.get(d, ())
        )
        for name in cfg.images
    }
    for d in empty:
        log.warning("%s: sequence %s is empty (no .dat under spike/): no records", manifest.path, d)
    for name, paths in extra.items():
        if paths:
            log.warning(
                "%s: %d %s images without a spike file (first: %s): not stored",
                manifest.path,
                len(paths),
                name,
                paths[0],
            )
    return {
        "images_without_spikes": {n: len(p) for n, p in extra.items()},
        "sequences_without_spikes": len(empty),
    }


def read_image(path: Path) -> np.ndarray:
    """A paired image as uint8 [channels, H, W]; unreadable: the record is skipped, counted."""
    import PIL.Image  # optional extra images

    try:
        with PIL.Image.open(path) as im:
            a = np.asarray(im.convert("L" if im.mode in ("L", "1", "I;16") else "RGB"))
    except OSError as e:
        raise SkipRecord("unreadable image", f"{path}: {e}") from None
    return a[None] if a.ndim == 2 else np.ascontiguousarray(a.transpose(2, 0, 1))
