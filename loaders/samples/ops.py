"""The deferred-op registry: op name -> its numpy finisher, and lazily its torch finisher.

A deferred op is what a batch leaves unfinished for the consumer (dense rows, a voxel grid, a
coordinate collation: :mod:`loaders.samples.payload`). Kept in a module of its own, free of the ops
themselves, so that a modality can register its ops by name without importing them (and their
libraries) until a batch needs one.

:data:`LAYOUT_ITEMS` maps a field layout to the deferred item its row gather returns by default
(``Rows.csr`` in :mod:`loaders.samples.gather`): the layout's gather is generic, the value it stands for
is the registering modality's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from loaders.plugins import load_loader_modalities
from loaders.plugins.registry import Registry

NumpyFinish = Callable[
    [Mapping[str, np.ndarray], Mapping[str, Any], "np.ndarray | None"], np.ndarray
]

OPS: Registry[NumpyFinish] = Registry("deferred op", discover=load_loader_modalities)
# op -> its torch finisher, registered lazily: the module is imported by the device layer on first
# use
TORCH_OPS: Registry[Any] = Registry(
    "torch finisher of deferred op", discover=load_loader_modalities
)


def register_op(name: str, torch_module: str | None = None) -> Callable[[NumpyFinish], NumpyFinish]:
    """Register the numpy finisher of op ``name``. Its torch finisher is registered with
    ``loaders.engine.device.register_torch_op`` in ``torch_module``, which the device layer imports when
    it first meets the op (so this module, and the decoder process, never import torch)."""

    def deco(fn: NumpyFinish) -> NumpyFinish:
        OPS.register(name, fn)
        if torch_module:
            TORCH_OPS.register_lazy(name, torch_module)
        return fn

    return deco


def register_torch_only_op(name: str, torch_module: str) -> None:
    """Register op ``name`` as *torch-only*: its value is one numpy cannot hold (a torch sparse
    tensor), so it has no numpy finisher and its torch finisher (registered in ``torch_module``)
    runs wherever its parts are, the host included. Transports always ship its parts."""

    def no_numpy(
        parts: Mapping[str, np.ndarray], meta: Mapping[str, Any], out: np.ndarray | None
    ) -> np.ndarray:
        raise TypeError(f"deferred op {name!r} is torch-only: it has no numpy finisher")

    no_numpy.torch_only = True  # type: ignore[attr-defined]
    OPS.register(name, no_numpy)
    TORCH_OPS.register_lazy(name, torch_module)


def get_op(name: str) -> NumpyFinish:
    return OPS.get(name)


def is_torch_only(name: str) -> bool:
    """Whether op ``name`` has no numpy finisher (:func:`register_torch_only_op`)."""
    return bool(getattr(OPS.get(name), "torch_only", False))


# field layout -> the deferred item class its gather returns, made of the gathered arrays and shape
LAYOUT_ITEMS: Registry[Callable[..., Any]] = Registry(
    "deferred item of field layout", discover=load_loader_modalities
)
