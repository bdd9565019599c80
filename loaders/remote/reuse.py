"""A shard another generation of the same URL already holds in this node's cache, taken instead of
downloaded again.

Why: a nightly rebuild that changes one source pushes a new ``index.json``; its cache folder is a
new one (``<cache_dir>/<url hash>/<new index digest>/``), and without this every node would
download the whole dataset again for the next epoch. A shard's file name carries its plan key, so
an unchanged shard keeps its name; its content is still checked against the new index's digest
before it is used (the caller's check), so a same-named shard with other bytes is downloaded.

Files are hard-linked where the file system allows (no second copy on disk), else copied. The
other generation's shard is pinned (shared ``flock``) while it is linked, so its eviction waits.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from urllib.parse import quote

from loaders.remote.ledger import PINS, remove_path


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or no hard links: a copy
        shutil.copy2(src, dst)


def adopt_from_other_generation(root: Path, name: str, dest: Path) -> bool:
    """Shard ``name`` from a sibling generation folder of ``root`` into ``dest`` (a temporary
    path); False when none holds it. A sibling's file that vanishes meanwhile (evicted) is
    skipped; ``dest`` is left absent then."""
    pin_name = f"{quote(name, safe='')}.pin"
    for other in sorted(root.parent.iterdir()) if root.parent.is_dir() else []:
        src = other / "shards" / name
        if other == root or not src.exists():
            continue
        try:
            fd = os.open(other / PINS / pin_name, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # an evictor takes it exclusively, without waiting
            if not src.exists():
                continue
            if src.is_dir():
                shutil.copytree(src, dest, copy_function=_link_or_copy)
            else:
                _link_or_copy(str(src), str(dest))
            return True
        except OSError:
            remove_path(dest)
        finally:
            os.close(fd)
    return False
