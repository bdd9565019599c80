"""What the data can tell about a spike manifest's resolution, which the ``.dat`` format does not
store.

A swapped resolution (``height = 400, width = 250`` for a 250x400 camera) reads every file
without an error: the frame size is the same. The data still tells: in a mean frame (spikes
averaged over a few dozen frames, an intensity image), neighbouring rows of a real scene
correlate strongly at the true width and not at a wrong one. Frame counts that differ across the
files of one sequence are the other tell (a halved resolution makes every file hold 4x the
frames, a mixed folder mixes counts). Both become counted build warnings, never a silent success;
the check reads at most ``FRAMES`` frames of at most ``FILES`` files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.modalities.spike.dat import count_frames, read_frames

FRAMES = 64  # frames averaged into the mean frame
FILES = 4  # files checked per build
LOW, HIGH = 0.5, 0.8  # row correlation: below LOW at the declared width, at least HIGH at another


def row_correlation(mean: np.ndarray, width: int) -> float:
    """Correlation of neighbouring rows of the flat mean frame cut into rows of ``width`` pixels."""
    rows = mean.size // width
    if rows < 3 or width < 2:
        return float("nan")
    m = mean[: rows * width].reshape(rows, width)
    a, b = m[:-1].ravel(), m[1:].ravel()
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def candidate_widths(height: int, width: int) -> list[int]:
    """The other widths a frame of ``height * width`` pixels is tried at: swapped, doubled, halved."""
    pixels = height * width
    return sorted(
        {w for w in (height, 2 * width, width // 2) if w > 1 and pixels % w == 0 and w != width}
    )


def resolution_hint(path: Path, height: int, width: int, packing: str) -> dict[str, Any] | None:
    """A better-correlating width when the declared one does not correlate, else None."""
    n = min(FRAMES, count_frames(path, height, width, packing))
    frames = read_frames(path, height, width, packing, False, 0, n)
    mean = frames.reshape(n, -1).mean(0, dtype=np.float64)
    declared = row_correlation(mean, width)
    scores = {w: row_correlation(mean, w) for w in candidate_widths(height, width)}
    best = max((w for w in scores if scores[w] == scores[w]), key=lambda w: scores[w], default=None)
    if best is None or not declared < LOW or scores[best] < HIGH:
        return None  # nan compares False: a flat mean frame says nothing
    return {
        "file": str(path),
        "declared": f"{height}x{width}",
        "row_correlation": round(declared, 3),
        "better_width": best,
        "its_row_correlation": round(scores[best], 3),
    }


def frame_facts(
    files: Sequence[tuple[str, Path, int]], height: int, width: int, packing: str
) -> dict[str, Any]:
    """Build stats from (sequence, file, frames) of every spike file: frames per file, the sequences
    whose files hold different frame counts, and resolution hints from the first files of the
    first sequences."""
    counts = [n for _, _, n in files]
    by_seq: dict[str, set[int]] = {}
    for seq, _, n in files:
        by_seq.setdefault(seq, set()).add(n)
    first_files = list({seq: path for seq, path, _ in reversed(files)}.values())[::-1][:FILES]
    hints = [
        h for p in first_files if (h := resolution_hint(p, height, width, packing)) is not None
    ]
    return {
        "frames_per_file": {
            "files": len(counts),
            "min": min(counts, default=0),
            "max": max(counts, default=0),
        },
        "sequences_with_unequal_frames": sorted(s for s, n in by_seq.items() if len(n) > 1),
        "resolution_hints": hints,
    }


def frame_warnings(stats: dict[str, Any]) -> list[str]:
    """The sentences ``inspect`` and the build summary show for :func:`frame_facts`' stats."""
    out = []
    unequal = stats.get("sequences_with_unequal_frames") or []
    if unequal:
        out.append(
            f"{len(unequal)} sequence(s) hold files of different frame counts ({', '.join(unequal[:3])}"
            f"{'...' if len(unequal) > 3 else ''}): a mixed folder or a wrong [spike] resolution"
        )
    for h in stats.get("resolution_hints") or []:
        out.append(
            f"{h['file']}: neighbouring rows of its mean frame do not correlate at the declared "
            f"{h['declared']} (r = {h['row_correlation']}) but do at width {h['better_width']} "
            f"(r = {h['its_row_correlation']}): check [spike] height and width (swapped?)"
        )
    return out
