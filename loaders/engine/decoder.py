"""The decoder process: windows decoded off the training process, into memory both processes map.

Why a process: on a 2-core node, decode threads inside the training process slowed batch assembly
about 2x (GIL hand-offs with zarr's event loop and codec threads), while the same decode in
another process left assembly at its solo speed (A/B in docs/LOADER.md). A window crosses once,
as a *slab*: a ``memfd`` (anonymous shared memory, freed when both sides drop it, even after a
SIGKILL) mapped in both processes and recycled between windows. The pipe carries only small JSON
messages, never shard data and never a pickle; the child is ``python -m loaders.engine.decoder``
(a fresh interpreter: it does not re-import the trainer's ``__main__`` as a spawn start would,
and does not import torch). What crosses (the slab, an arena as slab offsets, the messages) is
:mod:`loaders.engine.slab`; this module runs the two ends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import reduction
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from loaders.engine.slab import (
    DecoderError,
    Slab,
    SlabBuffers,
    export,
    rebuild,
    recv_message,
    send_message,
)
from loaders.engine.window import WindowReader
from loaders.format import FormatError
from loaders.format.integrity import DatasetRebuilt
from loaders.samples.arena import Arena

AVAILABLE = sys.platform.startswith("linux") and hasattr(os, "memfd_create")
POLL_S = 0.2  # how often a waiting parent checks that the child is still alive
HEARTBEAT_S = (
    0.5  # while the child works on a request it says so this often (a stopped child falls silent)
)
# default: a child silent this long is declared hung, killed, and decoding moves in-process
TIMEOUT_S = 30.0
HEADROOM = 1.05  # a new slab is this much bigger than asked, so that similar windows can reuse it


# -- the child
# ----------------------------------------------------------------------------------------
class _Link:
    """The child's end of the pipe: replies and heartbeats share it under a lock. A thread sends a
    heartbeat every HEARTBEAT_S while a request is being served (only then: unread beats never
    pile up), so the parent can tell a slow window from a stopped or stuck child."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.lock, self.busy = conn, threading.Lock(), threading.Event()
        self.busy.set()  # starting up counts as work
        threading.Thread(target=self._beat, name="decoder-heartbeat", daemon=True).start()

    def send(self, msg: dict[str, Any]) -> None:
        with self.lock:
            send_message(self.conn, msg)

    def _beat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            if self.busy.is_set():
                try:
                    self.send({"kind": "beat"})
                except OSError:
                    return


def serve(conn: Connection) -> None:
    """The child's loop: one request at a time, in order; ends when the parent closes its end."""
    try:
        _serve(conn, _Link(conn))
    except (
        EOFError,
        OSError,
    ):  # the parent went away (closed its end, or exited): nothing left to do
        return


def _serve(conn: Connection, link: _Link) -> None:
    start = recv_message(conn)
    threads = max(1, int(start.get("threads", 1)))
    try:
        import zarr  # import weight: zarr (~0.3 s), only for zarr shards

        zarr.config.set({"threading.max_workers": threads})
        # the parent's import path after ours (shadowing nothing): a plug-in the index names is
        # found here wherever the trainer found it, a folder it put on sys.path included
        sys.path.extend(p for p in start.get("path", []) if p not in sys.path)
        reader = WindowReader.from_spec(start["spec"])  # imports the plug-ins the index names
    except (
        Exception
    ) as e:  # reported on the first request, so the parent raises it where it is waiting
        link.send({"kind": "ready", "error": f"{type(e).__name__}: {e}"})
        return
    link.send({"kind": "ready"})
    link.busy.clear()
    pool = ThreadPoolExecutor(threads, thread_name_prefix="decode") if threads > 1 else None
    slabs: dict[int, Slab] = {}
    while True:
        msg = recv_message(conn)
        kind = msg["kind"]
        if kind == "slab":
            fd = reduction.recv_handle(conn)
            slabs[int(msg["id"])] = Slab(int(msg["id"]), int(msg["size"]), fd)
            os.close(fd)
        elif kind == "drop":
            slabs.pop(int(msg["id"]), None)
        elif kind == "window":
            link.busy.set()
            try:
                buffers = SlabBuffers(slabs[int(msg["slab"])])
                arena = reader.read_window(int(msg["epoch"]), int(msg["w"]), buffers, pool)
                desc = export(arena, buffers)
                reply = (
                    {"kind": "need", "bytes": buffers.used}
                    if buffers.overflow
                    else {"kind": "done", "arena": desc}
                )
            except FormatError as e:
                reply = {
                    "kind": "error",
                    "format": True,
                    "message": str(e),
                    "rebuilt": isinstance(e, DatasetRebuilt),
                }
            except Exception as e:  # a bug or an OS error: reported, the parent decides
                reply = {"kind": "error", "format": False, "message": f"{type(e).__name__}: {e}"}
            link.send(reply)
            link.busy.clear()
        else:
            return


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    serve(Connection(int(args[0])))


# -- the parent
# ---------------------------------------------------------------------------------------
class Decoder:
    """The training process's handle on its decoder process. Thread-safe; used only by the process
    that started it (a forked DataLoader worker inherits the object but must decode on its own)."""

    def __init__(
        self, spec: dict[str, Any], threads: int = 1, keep: int = 3, timeout: float = TIMEOUT_S
    ) -> None:
        mine, theirs = socket.socketpair()
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parent.parent)  # so the child imports this very package
        env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loaders.engine.decoder", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.pid, self.keep, self.timeout = os.getpid(), keep, max(float(timeout), 2 * HEARTBEAT_S)
        self.conn = Connection(mine.detach())
        self._lock = threading.Lock()  # one request at a time on the pipe
        self._free_lock = threading.Lock()
        self._free: list[Slab] = []
        self._slabs: dict[int, Slab] = {}
        self._next_id = 0
        self._ready: bool | None = None
        self._closed = False
        self._scale = 1.0
        self.peak_bytes = 0  # the most slab bytes this process held at once (window memory)
        self._post({"kind": "start", "spec": spec, "threads": threads, "path": list(sys.path)})

    def ready(self) -> bool:
        """Whether the child has started (never blocks): until then the caller decodes in-process."""
        if self._ready is None and self._lock.acquire(blocking=False):
            try:
                while self._ready is None and self.conn.poll(0):
                    msg = recv_message(self.conn)
                    if msg["kind"] != "beat":
                        self._take_ready(msg)
            except (EOFError, OSError) as e:
                raise self._died() from e
            finally:
                self._lock.release()
        return bool(self._ready)

    def _take_ready(self, msg: dict[str, Any] | None = None) -> None:
        msg = self._recv() if msg is None else msg
        if msg["kind"] != "ready":
            raise DecoderError(f"decoder process sent {msg['kind']!r} before starting")
        if msg.get("error"):
            raise DecoderError(f"decoder process could not start: {msg['error']}")
        self._ready = True

    def _died(self) -> DecoderError:
        try:
            code = self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            code = None
        return DecoderError(
            f"decoder process {self.proc.pid} exited (code {code}) or closed its pipe"
        )

    def _post(self, msg: dict[str, Any], fd: int | None = None) -> None:
        try:
            send_message(self.conn, msg)
            if fd is not None:
                reduction.send_handle(self.conn, fd, self.proc.pid)
        except OSError as e:  # a broken pipe: the child is gone
            raise self._died() from e

    def _recv(self) -> dict[str, Any]:
        """The next reply, heartbeats skipped; a child silent for ``timeout`` seconds (stopped,
        stuck) is killed and reported, never waited on forever."""
        deadline = time.monotonic() + self.timeout
        while True:
            while not self.conn.poll(POLL_S):
                if self.proc.poll() is not None:
                    raise DecoderError(
                        f"decoder process {self.proc.pid} exited with code {self.proc.returncode}"
                    )
                if time.monotonic() > deadline:
                    self.proc.kill()
                    raise DecoderError(
                        f"decoder process {self.proc.pid} sent no reply or heartbeat for "
                        f"{self.timeout:g} s (stopped or stuck); it was killed"
                    )
            try:
                msg = recv_message(self.conn)
            except (EOFError, OSError) as e:
                raise self._died() from e
            if msg["kind"] != "beat":
                return msg
            deadline = time.monotonic() + self.timeout

    def read_window(self, epoch: int, w: int, hint: int) -> Arena:
        """Window ``w`` of ``epoch`` decoded by the child into a slab (``hint``: bytes it will
        probably need). Bad shards raise FormatError naming the shard, as in-process; a dead
        child raises DecoderError."""
        desc, slab = self.read_slab(epoch, w, hint)
        arena = rebuild(desc, slab)
        arena.on_release = lambda s=slab: self._give_back(s)
        return arena

    def read_slab(self, epoch: int, w: int, hint: int) -> tuple[dict[str, Any], Slab]:
        """:meth:`read_window` as (the arena's description, its slab): what the broker hands to
        workers. The slab is this caller's until :meth:`give_back`."""
        if self._closed or os.getpid() != self.pid:
            raise DecoderError("decoder process used after close() or from another process")
        with self._lock:
            if self._ready is None:
                self._take_ready()
            need = int(hint * self._scale)  # learnt: what windows needed relative to their hint
            for _ in range(3):
                slab = self._slab(need)
                self._post({"kind": "window", "slab": slab.id, "epoch": int(epoch), "w": int(w)})
                reply = self._recv()
                if reply["kind"] == "done":
                    return reply["arena"], slab
                self._give_back(slab)
                if reply["kind"] == "need":
                    need = int(reply["bytes"])
                    self._scale = max(
                        self._scale, need / max(hint, 1)
                    )  # next windows ask for enough at once
                    continue
                if reply["kind"] == "error":
                    kind = (
                        DatasetRebuilt
                        if reply.get("rebuilt")
                        else FormatError
                        if reply.get("format")
                        else DecoderError
                    )
                    raise kind(reply["message"])
                raise DecoderError(f"decoder process sent {reply['kind']!r}")
            raise DecoderError(
                f"decoder process asked for ever more memory for window {w} of epoch {epoch}"
            )

    def _slab(self, need: int) -> Slab:
        """A free slab of ``need`` to ``2 * need`` bytes, or a new one (sent to the child); caller
        holds _lock."""
        with self._free_lock:
            fits = [s for s in self._free if need <= s.size <= 2 * need]
            pick = min(fits, key=lambda s: s.size) if fits else None
            if pick is not None:
                self._free.remove(pick)
            drop = self._free[: -self.keep] if len(self._free) > self.keep else []
            del self._free[: len(drop)]
        for s in drop:
            del self._slabs[s.id]
            s.close_fd()
            self._post({"kind": "drop", "id": s.id})
        if pick is not None:
            return pick
        self._next_id += 1
        slab = Slab(self._next_id, int(need * HEADROOM))
        try:
            self._post({"kind": "slab", "id": slab.id, "size": slab.size}, slab.fd)
        except BaseException:
            slab.close_fd()
            raise
        self._slabs[slab.id] = slab  # its fd stays open: the broker sends it to DataLoader workers
        self.peak_bytes = max(self.peak_bytes, sum(x.size for x in self._slabs.values()))
        return slab

    def give_back(self, slab: Slab) -> None:
        """The slab of a :meth:`read_slab` is free to be decoded into again."""
        self._give_back(slab)

    def _give_back(self, slab: Slab) -> None:
        with self._free_lock:
            if slab.id in self._slabs and all(s is not slab for s in self._free):
                self._free.append(slab)

    def close(self) -> None:
        """Stop the child (it also stops by itself when this process dies: its pipe closes)."""
        if self._closed or os.getpid() != self.pid:
            return
        self._closed = True
        for slab in list(self._slabs.values()):
            slab.close_fd()
        try:
            self.conn.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    main()
