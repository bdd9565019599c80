"""Names read back from a dataset's own files (index.json, a push record, a journal, the node
cache's pin files) are names of files *inside* the dataset: plain, relative, of the shape a build
gives them.

Why a module of its own, in ``loaders``: those files are data anyone who can write the folder or
the bucket controls, and every one of their names ends up joined to a folder and written,
renamed or deleted there (a shard downloaded into the node cache, a retired file deleted by a
rebuild). The rule is checked once, where such a name is parsed, by the loaders
(``loaders.format.values``, ``loaders.remote``) and by the pipeline (``pipeline.paths``, which adds the
check against folder links that only a local folder needs); ``loaders`` never imports
``pipeline``, so the rule lives here, below both.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from loaders.format.errors import FormatError

SHAPE = "a build writes names such as 'train-000-001-<16 hex>.zarr' or 'conditions-<16 hex>.tar'"


def relative_name(rel: object) -> bool:
    """Whether ``rel`` is a relative POSIX name that cannot leave the folder it is joined to: not
    absolute, no ``..`` part, no backslash, NUL or empty part (``//``: ``"shards/" + "/abs"``),
    not ``.``. A lexical check only: what a symlinked folder on the way does is the caller's."""
    if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel or "//" in rel:
        return False
    pure = PurePosixPath(rel)
    return not (pure.is_absolute() or ".." in pure.parts or pure == PurePosixPath("."))


def plain_name(name: object) -> bool:
    """Whether ``name`` is the name of one dataset file as a build gives it: a single relative
    path part, not hidden (a leading ``.`` is what the readers' own bookkeeping uses: the cache's
    ``.pins``, ``.tmp``), no control character, at most 255 bytes."""
    return (
        relative_name(name)
        and "/" not in name  # type: ignore[operator]
        and not name.startswith(".")  # type: ignore[union-attr]
        and name.isprintable()  # type: ignore[union-attr]
        and len(name.encode()) <= 255  # type: ignore[union-attr]
    )


def checked_name(name: object, key: str) -> str:
    """``name`` when it is a :func:`plain_name`; else a :class:`FormatError` naming ``key`` (where
    it was read: ``shards[].file``, ``conditions.file``) and why the dataset is refused (the
    caller's reader prefixes the file it read: ``read_index`` names index.json)."""
    if plain_name(name):
        return str(name)
    raise FormatError(
        f"{key} = {name!r} is not a plain file name ({SHAPE}): a name with a folder, "
        "'..' or an absolute path would be read, downloaded or deleted outside the dataset, so "
        "the dataset is refused (it was not written by shardsmith, or was edited; nothing was "
        "written)"
    )
