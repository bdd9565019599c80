"""One writer per output folder: an exclusive `flock` on ``OUT/.shardsmith.lock``, held by `build`
and `gc` for their whole run.

Why flock: the kernel releases it when the holder dies (``kill -9`` included), so a crashed build
never leaves a lock someone must remove by hand, and there is no stale-pid guessing. The holder
writes its pid, host and start time into the file, so a refused build can say who holds it; that
text is only a message: the lock itself is the truth (a file left with text after a crash is not
a held lock). On Linux NFSv4, flock is forwarded to the server; on file systems without locking
support the build fails with the errno instead of running unprotected. Readers (loaders, verify,
inspect) never take the lock: they rely on generations (`pipeline.generations`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.errors import EXIT_BAD_INPUT, EXIT_CRASH, LockHeldError, OutputError

LOCK_FILE = ".shardsmith.lock"
POLL_S = 0.1  # how often a waiting build retries


def output_error(out: Path, e: OSError, doing: str) -> OutputError:
    """A clear error for a failed write into ``out``: the folder, what was being done, the errno by
    name. Read-only or forbidden folders are bad input (exit 2); a full disk or quota is the
    environment (exit 1)."""
    name = errno.errorcode.get(e.errno or 0, "?")
    where = f" ({e.filename})" if e.filename else ""
    code = EXIT_BAD_INPUT if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else EXIT_CRASH
    return OutputError(
        f"cannot write to --out {out}: {doing}: [Errno {e.errno} {name}] {e.strerror}{where}; "
        f"nothing was committed: the previous dataset in {out} (if any) is intact",
        code,
    )


HOLDER_POLLS = 20  # x 50 ms: how long a refused build waits for the holder's pid before naming none


def holder(out: Path) -> str:
    """Who holds the lock, as the holder wrote it (pid, host, since), or a placeholder while it is
    writing."""
    text = ""
    for _ in range(
        HOLDER_POLLS
    ):  # the holder writes its note right after locking: give it a moment
        try:
            text = (out / LOCK_FILE).read_text().strip()
        except OSError:
            text = ""
        if text:
            return text
        time.sleep(0.05)
    return "a process that has not yet written its pid"


@contextmanager
def exclusive(out: Path, wait: float = 0.0, what: str = "build") -> Iterator[None]:
    """Hold the exclusive lock on ``out`` (which must exist) for the ``with`` block. Another holder:
    raise `LockHeldError` at once, or after retrying for ``wait`` seconds."""
    path = out / LOCK_FILE
    deadline = time.monotonic() + max(0.0, wait)
    fd = _open(out, path)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not _still_named(
                    fd, path
                ):  # its holder removed it (a failed first build): lock the new one
                    os.close(fd)
                    fd = -1
                    fd = _open(out, path)
                    continue
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    waited = f" (waited {wait:g} s)" if wait > 0 else ""
                    raise LockHeldError(
                        f"cannot {what} {out}: it is locked by another shardsmith process{waited}: held by "
                        f"{holder(out)}. "
                        f"Only one build or gc may write a dataset at a time: wait for it, pass --wait SECONDS, "
                        f"or use another --out"
                    ) from None
                time.sleep(min(POLL_S, left))
            except OSError as e:
                raise output_error(out, e, "locking") from None
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        note = f"pid {os.getpid()} on host {socket.gethostname()} since {stamp} ({what}: {' '.join(sys.argv)[:200]})\n"
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, note.encode(), 0)
        except OSError as e:
            raise output_error(out, e, "writing the lock file") from None
        try:
            yield
        finally:
            os.ftruncate(
                fd, 0
            )  # a finished holder leaves an empty file (the same bytes after every build)
    finally:
        if fd >= 0:
            os.close(fd)  # releases the flock


def _open(out: Path, path: Path) -> int:
    try:
        out.mkdir(
            parents=True, exist_ok=True
        )  # gone if a failed first build removed its folder meanwhile
        return os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666
        )  # the umask decides the mode
    except OSError as e:
        raise output_error(out, e, "creating the lock file") from None


def _still_named(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file ``fd`` locked (not unlinked or replaced since we opened
    it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (here.st_ino, here.st_dev)
