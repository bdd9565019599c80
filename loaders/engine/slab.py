"""What crosses from the decoder process to the processes that serve its windows: the slab (a
``memfd`` mapped in both), the bump allocator a window is decoded into, an arena described as slab
offsets and rebuilt from them, and the small JSON messages on the pipe beside it.

Why a module of its own: these are the wire format, shared by the decoder process and its parent
(:mod:`loaders.engine.decoder`) and by the broker, which hands the same slabs on to DataLoader
workers (:mod:`loaders.engine.broker`); neither needs the other's process handling to read or build
them. Torch-free, like the decoder process that imports it.
"""

from __future__ import annotations

import json
import mmap
import os
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from loaders.samples.arena import ALIGN, Arena


class DecoderError(RuntimeError):
    """The decoder process died or broke the protocol (never raised for bad shards: those are
    FormatError)."""


class Slab:
    """A memfd mapped into this process; arrays are views of it. The owner array is uint64 because
    scipy copies a CSR component whose ``base`` has more than twice its *elements*
    (``_prune_array``)."""

    def __init__(self, sid: int, size: int, fd: int | None = None, readonly: bool = False) -> None:
        size = -(-max(size, ALIGN) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.id, self.size = sid, size
        if fd is None:
            fd = os.memfd_create(f"shardsmith-window-{sid}", getattr(os, "MFD_CLOEXEC", 0))
            os.ftruncate(fd, size)
        self.fd: int | None = fd
        # read-only in DataLoader workers (loaders.engine.broker): a stray write raises instead of
        # corrupting a window
        self._mm = mmap.mmap(fd, size, prot=mmap.PROT_READ) if readonly else mmap.mmap(fd, size)
        self.words = np.frombuffer(self._mm, np.uint64)
        self.bytes = self.words.view(np.uint8)
        self.base = self.bytes.ctypes.data

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def view(self, offset: int, dtype: str, shape: list[int]) -> np.ndarray:
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if offset < 0 or offset % dt.itemsize or offset + n > self.size:
            raise DecoderError(
                f"decoder sent an array outside its slab ({offset}+{n} of {self.size})"
            )
        return self.bytes[offset : offset + n].view(dt).reshape(shape)


class SlabBuffers:
    """A bump allocator over a slab (the child's stand-in for a BufferPool). When the slab is too
    small it hands out private memory and counts what the window needed, so the parent can send a
    bigger slab."""

    def __init__(self, slab: Slab) -> None:
        self.slab, self.used = slab, 0

    def get(self, n: int, dtype: np.dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        at = -(-self.used // ALIGN) * ALIGN
        self.used = at + n * dt.itemsize
        if self.used > self.slab.size:
            return np.empty(n, dt)
        return self.slab.bytes[at : self.used].view(dt)

    def put(self, *arrays: np.ndarray) -> None:
        pass

    def place(self, a: np.ndarray) -> list[Any]:
        """``[offset, dtype, shape]`` of ``a`` in the slab (copied in when it lives elsewhere)."""
        at = a.ctypes.data - self.slab.base
        if not (a.flags.c_contiguous and 0 <= at and at + a.nbytes <= self.slab.size):
            out = self.get(a.size, a.dtype)
            out[...] = a.reshape(-1)
            at = out.ctypes.data - self.slab.base
        return [int(at), a.dtype.str, [int(s) for s in a.shape]]

    @property
    def overflow(self) -> bool:
        return self.used > self.slab.size


def export(arena: Arena, buffers: SlabBuffers) -> dict[str, Any]:
    """The arena as slab offsets (JSON-able): what the parent needs to rebuild it over its own
    mapping."""
    return {
        "arrays": {name: buffers.place(a) for name, a in arena.arrays().items()},
        "layouts": arena.layouts,
        "skipped": arena.skipped,
    }


def rebuild(desc: dict[str, Any], slab: Slab) -> Arena:
    arena = Arena.from_arrays(
        {name: slab.view(*v) for name, v in desc["arrays"].items()}, desc["layouts"]
    )
    arena.skipped = list(desc.get("skipped", []))
    return arena


def send_message(conn: Connection, msg: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(msg).encode())


def recv_message(conn: Connection) -> dict[str, Any]:
    msg = json.loads(conn.recv_bytes())
    if not isinstance(msg, dict) or "kind" not in msg:
        raise DecoderError(f"unexpected message {msg!r}")
    return msg
