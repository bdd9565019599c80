"""Names read back from files in a dataset folder (journals, index.json) stay inside that folder.

Why a module of its own: the build deletes, reuses and carries on the files those names point at,
and a journal or an index is a file anyone with write access to the folder can edit. Both the
generation bookkeeping (`pipeline.generations`) and the no-change check (`pipeline.incremental`,
which `generations` imports) ask this one question, so it sits below both.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from loaders import format as fmt
from loaders.format.names import relative_name


def inside(out: Path, rel: object) -> bool:
    """Whether ``rel``, a name read back from a journal or an index, names a path inside ``out``:
    relative, no ``..``, and no symlinked folder on the way that leads out. Those files are deleted
    by name, so a name that leaves the folder (a tampered or hostile file) must never reach
    ``pipeline.generations.remove``."""
    if not relative_name(rel):  # the rule the loaders apply to every name they read back
        return False
    pure = PurePosixPath(str(rel))
    try:
        parent = (out / pure).parent.resolve()
        return parent == out.resolve() or parent.is_relative_to(out.resolve())
    except (OSError, RuntimeError):  # a symlink loop on the way
        return False


def shard_inside(out: Path, file: object) -> bool:
    """Whether a shard's ``file`` as index.json names it (relative to ``out/shards``) stays inside
    ``out``. Checked apart from ``inside``: joined to the folder, an absolute name replaces it
    (``out / "shards" / "/x"`` is ``/x``), while ``"shards//x"`` reads as a relative name."""
    return (
        isinstance(file, str)
        and not file.startswith("/")
        and inside(out, f"{fmt.SHARDS_DIR}/{file}")
    )
