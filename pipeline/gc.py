"""`shardsmith gc DIR`: remove from a dataset folder what no live generation names.

What goes: files the index retired whose deletion was interrupted, files of builds that died
before their commit (named by their journals), their spill folders and temporary files. What
stays: the committed generation's files and the previous generation's (a reader may still be
using them; ``drop_previous`` removes those too, and such a reader then gets the "dataset
rebuilt" error), and every file shardsmith did not write. Holds the folder's lock like a build,
so it never deletes what a running build is writing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from loaders import format as fmt
from pipeline import generations
from pipeline.errors import OutputError
from pipeline.model import open_index

log = logging.getLogger(__name__)


def gc(out: str | Path, wait: float = 0.0, drop_previous: bool = False) -> list[str]:
    """Collect ``out``'s garbage; returns the removed paths (relative to ``out``)."""
    out = Path(out)
    if not out.is_dir():
        raise OutputError(
            f"gc: {out} is not a folder (pass a dataset folder, the --out of a build)"
        )
    with generations.writing(out, wait, what="gc"):
        index = open_index(out) if fmt.index_path(out).exists() else None
        removed = generations.sweep(out, index)
        if drop_previous and index is not None and index.previous is not None:
            current = set(index.files())
            removed += [
                f for f in index.previous.files() if f not in current and generations.remove(out, f)
            ]
    log.info("gc %s: %d removed", out, len(removed))
    return removed
