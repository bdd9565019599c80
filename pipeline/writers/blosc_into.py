"""Blosc compression into a reused buffer: numcodecs' bytes, without a fresh destination per chunk.

Why: ``numcodecs.Blosc.encode`` allocates each chunk's destination (its raw size + 16 bytes) as a
new bytes object. Above the build's 1 MiB mmap threshold (`pipeline.memory`) that is a fresh
mapping whose pages fault in as Blosc writes them and go back at free: 7.4 against 6.1 ms of CPU
per 8 MiB chunk (lz4, level 5, byte shuffle, int32 and float32 counts; one process, interleaved,
then a script; now tests/benchmarks/test_micro_blosc.py, `make bench-micro`). Here the C function numcodecs itself calls when Blosc's
global threads are off (``blosc_compress_ctx`` of the c-blosc built into numcodecs' extension,
with the same arguments) writes into one buffer per encoder in the thread's scratch
(`pipeline.buffers`), which a build drops with the rest when its tasks are done.

Where that extension does not export the function, `blosc_into` returns None and the caller keeps
numcodecs' encode. Either way the zarr writer's template probe compares the files it writes with
zarr-python's before it uses them (`pipeline.writers.zarr_direct`).
"""

from __future__ import annotations

import ctypes
import itertools
from typing import Any

import numpy as np

from pipeline.buffers import thread_scratch

MAX_OVERHEAD = 16  # BLOSC_MAX_OVERHEAD: the header a chunk may add to its raw size
_NUMBERS = itertools.count()  # each encoder's own buffer name (encoders may be chained)


def _compress_ctx() -> Any:
    """numcodecs' ``blosc_compress_ctx``, typed, or None."""
    try:
        import numcodecs.blosc  # import weight: ~0.2 s, a no-change rebuild writes nothing

        fn = ctypes.CDLL(numcodecs.blosc.__file__).blosc_compress_ctx
    except (ImportError, OSError, AttributeError):
        return None
    size = ctypes.c_size_t
    fn.argtypes = [
        ctypes.c_int,  # clevel
        ctypes.c_int,  # doshuffle
        size,  # typesize
        size,  # nbytes
        ctypes.c_void_p,  # src
        ctypes.c_void_p,  # dest
        size,  # destsize
        ctypes.c_char_p,  # compressor
        size,  # blocksize
        ctypes.c_int,  # numinternalthreads
    ]
    fn.restype = ctypes.c_int
    return fn


class BloscInto:
    """``encode(buf) -> memoryview``: ``buf`` (contiguous bytes) compressed into this encoder's
    buffer in the calling thread's scratch, valid until its next call there. ctypes releases the GIL for
    the call, so pack threads compress in parallel as with numcodecs."""

    def __init__(
        self, fn: Any, cname: str, clevel: int, shuffle: int, blocksize: int, typesize: int
    ) -> None:
        self.fn, self.cname = fn, cname.encode()
        self.clevel, self.shuffle, self.blocksize, self.typesize = (
            clevel,
            shuffle,
            blocksize,
            typesize,
        )
        self.name = f"blosc-{next(_NUMBERS)}"  # in the thread's scratch (pipeline.buffers)

    def encode(self, buf: np.ndarray) -> memoryview:
        src = np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
        need = src.nbytes + MAX_OVERHEAD
        dest = thread_scratch().get(self.name, np.uint8, need)
        n = self.fn(
            self.clevel,
            self.shuffle,
            self.typesize,
            src.nbytes,
            src.ctypes.data,
            dest.ctypes.data,
            need,
            self.cname,
            self.blocksize,
            1,
        )
        if n <= 0:
            raise RuntimeError(f"blosc_compress_ctx failed ({n}) on {src.nbytes} bytes")
        return memoryview(dest)[:n]


def blosc_into(
    cname: str, clevel: int, shuffle: int, blocksize: int, typesize: int
) -> BloscInto | None:
    """An encoder with numcodecs' output, or None where numcodecs' extension lacks the call."""
    fn = _compress_ctx()
    if fn is None:
        return None
    return BloscInto(fn, cname, clevel, shuffle, blocksize, typesize)
