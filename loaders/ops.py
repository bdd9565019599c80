"""The deferred-op registry: op name -> its numpy finisher, and lazily its torch finisher.

A deferred op is what a batch leaves unfinished for the consumer (a CSR densify, a voxel grid, a coordinate
collation: :mod:`loaders.payload`). Kept in a module of its own, free of the ops themselves, so that a
modality can register its ops by name without importing them (and their libraries) until a batch needs one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from loaders.plugins import load_loader_modalities
from loaders.registry import Registry

NumpyFinish = Callable[[Mapping[str, np.ndarray], Mapping[str, Any], "np.ndarray | None"], np.ndarray]

OPS: Registry[NumpyFinish] = Registry("deferred op", discover=load_loader_modalities)
# op -> its torch finisher, registered lazily: the module is imported by the device layer on first use
TORCH_OPS: Registry[Any] = Registry("torch finisher of deferred op", discover=load_loader_modalities)


def register_op(name: str, torch_module: str | None = None) -> Callable[[NumpyFinish], NumpyFinish]:
    """Register the numpy finisher of op ``name``. Its torch finisher is registered with
    ``loaders.device.register_torch_op`` in ``torch_module``, which the device layer imports when it first
    meets the op (so this module, and the decoder process, never import torch)."""

    def deco(fn: NumpyFinish) -> NumpyFinish:
        OPS.register(name, fn)
        if torch_module:
            TORCH_OPS.register_lazy(name, torch_module)
        return fn

    return deco


def get_op(name: str) -> NumpyFinish:
    return OPS.get(name)
