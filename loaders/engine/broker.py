"""Workers share one decode: the rank's decoder process decodes each window once; DataLoader workers
map it.

Why: workers take alternate batches (so the order does not depend on ``num_workers``), hence
every worker needs every window of the rank. Decoding them in each worker multiplied decode CPU
and window memory by W. Here the training process runs a :class:`Broker` (a thread and one per
connected worker, no torch) in front of its :class:`~loaders.engine.decoder.Decoder`: a worker
asks for ``(epoch, w)``; the first ask decodes it (in the decoder process, into a ``memfd``
slab), later asks get the same slab. The reply is a small JSON description plus the slab's file
descriptor (``SCM_RIGHTS``); the worker maps it read-only and gathers from it.

Lifetime: a window is held while any worker holds it, then kept among the ``keep`` most recent
ones (a worker a few batches behind asks for the window another one just let go) and finally its
slab goes back to the decoder's pool. A worker that dies drops its holds (its socket closes).
Memfds and the abstract-namespace socket leave nothing in /dev/shm or on disk, whatever kills
whom.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections import OrderedDict
from concurrent.futures import Future
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

from loaders.engine.decoder import Decoder
from loaders.engine.slab import DecoderError, Slab, rebuild, recv_message, send_message
from loaders.format import FormatError
from loaders.format.integrity import DatasetRebuilt
from loaders.samples.arena import Arena

Key = tuple[int, int]  # (epoch, window)


class BrokerError(RuntimeError):
    """The broker is unreachable (the training process went away): the worker decodes by itself."""


class Broker:
    """The training process's side (see module docstring). ``hint(epoch, w)``: bytes a window may
    need."""

    def __init__(self, decoder: Decoder, hint: Any, keep: int = 1) -> None:
        self.decoder, self.hint, self.keep = decoder, hint, keep
        self.address = (
            f"\0shardsmith-{os.getpid()}-{secrets.token_hex(8)}"  # abstract: no file to clean up
        )
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.address)
        self.sock.listen(64)
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._windows: dict[
            Key, tuple[Future[tuple[dict[str, Any], Slab]], list[int]]
        ] = {}  # -> (read, [holds])
        self._idle: OrderedDict[Key, None] = OrderedDict()  # held by nobody, newest last
        self.decodes = 0
        self._closed = False
        threading.Thread(target=self._accept, name="shard-broker", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(
                target=self._client,
                args=(Connection(s.detach()),),
                name="shard-broker-client",
                daemon=True,
            ).start()

    def _get(self, key: Key) -> tuple[dict[str, Any], Slab]:
        with self._lock:
            got = self._windows.get(key)
            owner = got is None
            if owner:
                got = (Future(), [0])
                self._windows[key] = got
            got[1][0] += 1
            self._idle.pop(key, None)
        fut = got[0]
        if owner:
            try:
                fut.set_result(self.decoder.read_slab(key[0], key[1], self.hint(*key)))
                self.decodes += 1
            except BaseException as e:
                fut.set_exception(e)
                with self._lock:
                    self._windows.pop(key, None)
        return fut.result()

    def _drop(self, key: Key) -> None:
        with self._lock:
            got = self._windows.get(key)
            if got is None:
                return
            got[1][0] -= 1
            if got[1][0] > 0:
                return
            self._idle[key] = None
            free = []
            while len(self._idle) > self.keep:
                old, _ = self._idle.popitem(last=False)
                free.append(self._windows.pop(old)[0])
        for f in free:
            if f.exception() is None:
                self.decoder.give_back(f.result()[1])

    def _client(self, conn: Connection) -> None:
        held: list[Key] = []
        try:
            while True:
                msg = recv_message(conn)
                key = (int(msg["epoch"]), int(msg["w"]))
                if msg["kind"] == "release":
                    if key in held:
                        held.remove(key)
                        self._drop(key)
                    continue
                try:
                    desc, slab = self._get(key)
                except FormatError as e:
                    send_message(
                        conn,
                        {
                            "kind": "error",
                            "format": True,
                            "rebuilt": isinstance(e, DatasetRebuilt),
                            "message": str(e),
                        },
                    )
                    continue
                except Exception as e:
                    send_message(
                        conn,
                        {"kind": "error", "format": False, "message": f"{type(e).__name__}: {e}"},
                    )
                    continue
                held.append(key)
                send_message(
                    conn, {"kind": "window", "arena": desc, "slab": slab.id, "size": slab.size}
                )
                reduction.send_handle(conn, slab.fd, 0)  # type: ignore[arg-type]
        except (EOFError, OSError, ValueError):
            pass
        finally:
            for key in held:  # a worker that went away holds nothing
                self._drop(key)
            conn.close()

    def close(self) -> None:
        if self._closed or os.getpid() != self.pid:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class BrokerClient:
    """A worker's side: windows from the broker as read-only arenas (one request at a time)."""

    def __init__(self, address: str) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(address)
        except OSError as e:
            s.close()
            raise BrokerError(f"window broker unreachable ({e})") from e
        self.conn, self.pid, self._lock = Connection(s.detach()), os.getpid(), threading.Lock()

    def read_window(self, epoch: int, w: int) -> Arena:
        try:
            with self._lock:
                send_message(self.conn, {"kind": "window", "epoch": int(epoch), "w": int(w)})
                reply = recv_message(self.conn)
                if reply["kind"] == "error":
                    kind = (
                        DatasetRebuilt
                        if reply.get("rebuilt")
                        else FormatError
                        if reply.get("format")
                        else DecoderError
                    )
                    raise kind(reply["message"])
                fd = reduction.recv_handle(self.conn)
        except (EOFError, OSError) as e:
            raise BrokerError(f"window broker went away ({e})") from e
        try:
            slab = Slab(int(reply["slab"]), int(reply["size"]), fd, readonly=True)
        finally:
            os.close(fd)  # the mapping keeps the memory
        slab.fd = None
        arena = rebuild(reply["arena"], slab)
        arena.on_release = lambda: self._release(epoch, w)
        return arena

    def _release(self, epoch: int, w: int) -> None:
        try:
            with self._lock:
                send_message(self.conn, {"kind": "release", "epoch": int(epoch), "w": int(w)})
        except (OSError, ValueError):
            pass  # the broker is gone: nothing to give back

    def close(self) -> None:
        self.conn.close()
