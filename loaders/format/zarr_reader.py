"""The zarr v3 shard encoding, read side: zarr-python reads a shard's columns, and a column can
decode straight into a caller's buffer (:class:`Column`), so the loader reuses one buffer pool
across windows. Registered as reader ``"zarr"`` by :mod:`loaders.format.readers`; the tar encoding
is :mod:`loaders.format.tar_reader`.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loaders.format import FormatError
from loaders.format.codecs import load_zarr_codecs
from loaders.format.forksafe import fork_safe_lock


def _zarr_lock_after_fork() -> None:
    """zarr resets its event loop in a forked child but not the lock that guards creating a new one:
    a DataLoader worker forked while one of our decode threads held it (creating the loop) waits
    on it forever (seen as a hung bench). A child has only the forking thread, so a fresh lock is
    always right."""
    sync = sys.modules.get("zarr.core.sync")
    if sync is not None:
        sync._lock = None  # zarr allocates a new one on first use


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_zarr_lock_after_fork)

_ZARR_IMPORT_LOCK = (
    fork_safe_lock()
)  # a forked worker gets it unlocked (loaders/format/forksafe.py)


def import_zarr() -> None:
    """Import zarr's modules we use once, under a lock: decode threads importing zarr for the first
    time at once can see a partially initialised module (``cannot import name 'StorePath' ...
    circular import``)."""
    if "zarr.storage" in sys.modules and "zarr.core.buffer" in sys.modules:
        return
    with _ZARR_IMPORT_LOCK:
        import zarr  # noqa: F401
        import zarr.core.buffer  # noqa: F401
        import zarr.storage  # noqa: F401


_WARMING: list[threading.Thread] = []


def warm_zarr() -> None:
    """Import zarr on a thread now, once per process: a URL dataset's open calls it, so the
    import (0.3-0.5 s on two busy cores) runs while the first window downloads, not after its last
    byte, before its first batch. A fork waits for it: a child forked mid-import would hold a
    half-initialised module."""
    if _WARMING or ("zarr.storage" in sys.modules and "zarr.core.buffer" in sys.modules):
        return
    thread = threading.Thread(target=import_zarr, name="zarr-import", daemon=True)
    _WARMING.append(thread)
    thread.start()


def _finish_warming() -> None:
    for thread in _WARMING:
        if thread is not threading.current_thread():
            thread.join()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_finish_warming)


# -- zarr v3
# ------------------------------------------------------------------------------------------
# Read through zarr-python. A column can decode straight into a caller's buffer (get_basic_selection
# with out=), so the loader reuses one buffer pool across windows instead of faulting in fresh pages
# per shard.


@dataclass(frozen=True)
class Column:
    """One column of a shard: its shape, dtype, and how to decode it into a caller's buffer."""

    shard: Path
    key: str
    shape: tuple[int, ...]
    dtype: np.dtype
    source: Any  # a zarr.Array, or the ndarray another encoding's reader decoded already

    @property
    def capacity(self) -> int:
        """Rows a destination buffer needs."""
        return self.shape[0]

    def read(self) -> np.ndarray:
        return (
            self.source
            if isinstance(self.source, np.ndarray)
            else self.read_into(np.empty(self.shape, self.dtype))
        )

    def read_into(self, out: np.ndarray) -> np.ndarray:
        """Decode into ``out[:rows]`` and return that view (``out`` may be longer: a pooled buffer)."""
        n = self.shape[0]
        if (
            out.dtype != self.dtype
            or out.shape[1:] != self.shape[1:]
            or out.shape[0] < n
            or not out.flags.c_contiguous
        ):
            raise FormatError(
                f"{self.shard}: {self.key!r} is {self.dtype}{list(self.shape)}, expected {out.dtype} "
                f"with <= {out.shape[0]} rows of {list(out.shape[1:])}"
            )
        try:
            if isinstance(self.source, np.ndarray):
                out[:n] = self.source
            elif n:
                import_zarr()
                from zarr.core.buffer import (
                    default_buffer_prototype,  # import weight: zarr (~0.3 s), only for zarr shards
                )

                dest = default_buffer_prototype().nd_buffer.from_numpy_array(out[:n])
                self.source.get_basic_selection(Ellipsis, out=dest)
        except FormatError:
            raise
        except Exception as e:  # corrupt or truncated chunk: name the shard, never hang
            raise FormatError(
                f"{self.shard}: cannot read {self.key!r} ({type(e).__name__}: {e})"
            ) from e
        return out[:n]


def open_zarr_columns(path: Path, keys: Sequence[str], store: Any = None) -> dict[str, Column]:
    """Open the arrays ``keys`` (metadata only, no chunk is read); errors name the shard. ``store``:
    a zarr store holding the shard's bytes already (``loaders.format.integrity`` reads and checks them
    first), else the folder."""
    import_zarr()
    import zarr  # import weight: zarr (~0.3 s), only for zarr shards

    # arrays may name a field codec (e.g. spike windows): zarr must know it to decode
    load_zarr_codecs()
    try:
        group = zarr.open_group(str(path) if store is None else store, mode="r")
        out = {}
        for key in keys:
            try:
                a = group[key]
            except KeyError:
                raise FormatError(f"{path}: shard has no column {key!r}") from None
            if not isinstance(a, zarr.Array):
                raise FormatError(f"{path}: shard has no column {key!r} (a group is there)")
            out[key] = Column(path, key, tuple(int(s) for s in a.shape), np.dtype(a.dtype), a)
        return out
    except (FileNotFoundError, zarr.errors.GroupNotFoundError):
        raise FormatError(f"{path}: shard is missing or not a zarr group") from None
    except FormatError:
        raise
    except Exception as e:  # corrupt metadata: name the shard, never hang
        raise FormatError(f"{path}: cannot read shard ({type(e).__name__}: {e})") from e


def read_zarr_shard(path: Path, keys: Sequence[str]) -> dict[str, np.ndarray]:
    return {k: c.read() for k, c in open_zarr_columns(Path(path), keys).items()}
