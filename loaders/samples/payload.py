"""A batch before transport: numpy arrays, plus *deferred* items finished in numpy or on the device.

A deferred item is work that is cheaper on the device than on the host, or that makes the
host-to-device copy smaller when done after it (expanding sparse rows to dense ones, unpacking
bit-packed values). Each is an *op*: it ships named numpy parts plus JSON-able meta, has a numpy
finisher (here, torch-free: used on the CPU and by DataLoader workers asked for finished batches)
and a torch finisher registered with :func:`loaders.engine.device.register_torch_op` under the same
name; both must give equal results (tested per op). An op whose value only torch can hold (a torch
sparse tensor, say) is *torch-only* (:func:`loaders.samples.ops.register_torch_only_op`): its torch
finisher runs wherever its parts are.

Where an item crosses to a device it may take another form (:meth:`Deferred.for_device`); what the
user finally gets is its :attr:`Deferred.delivery`: the finished value, or the parts themselves.
Both are the item's to say (its sample type picks them from its load-time options), never the
transport's.

Registry in the style of numcodecs: :func:`register_op` / :func:`get_op`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from loaders.samples.ops import OPS, TORCH_OPS, NumpyFinish, get_op, register_op  # noqa: F401 (re-exported)

FINISHED = "finished"  # the user gets the finished value (numpy, or torch's on a device)
PARTS = "parts"  # the user gets the parts themselves, ``key.<part>`` tensors, never finished
DELIVERIES = (FINISHED, PARTS)


class Deferred(ABC):
    """One deferred value of a batch (see module docstring)."""

    op: ClassVar[str]
    delivery: ClassVar[str] = FINISHED  # what the user gets: FINISHED or PARTS (a subclass says)

    @abstractmethod
    def parts(self) -> dict[str, np.ndarray]:
        """The arrays shipped to the consumer (name -> array)."""

    @abstractmethod
    def meta(self) -> dict[str, Any]:
        """JSON-able parameters the finishers need (shapes, offsets)."""

    @abstractmethod
    def out_shape(self) -> tuple[int, ...]:
        """Shape of the finished value."""

    out_dtype: ClassVar[np.dtype] = np.dtype(np.float32)

    def finish(self, out: np.ndarray | None = None, zeroed: bool = True) -> np.ndarray:
        """The finished value in numpy (into ``out``, a flat buffer of the right size, if given;
        finishers take it zero-filled: ``zeroed=False`` says it holds old bytes, and it is zeroed
        first)."""
        if out is not None and not zeroed:
            out.fill(0)
        return get_op(self.op)(self.parts(), self.meta(), out)

    def for_device(self) -> Deferred:
        """The form this item crosses in when a device finishes it (collate's ``"positions"``
        output): itself, unless another op is cheaper to finish there (e.g. sparse rows as flat
        positions and values)."""
        return self

    def as_form(self, form: str) -> Deferred:
        """This item in the delivery form named ``form``, if it has one by that name (the names are
        its own, e.g. a sample type's option values); itself otherwise. Transports given a form
        name as their output call it on every item (``to_tensors(payload, form)``)."""
        return self


@dataclass
class Payload:
    """A batch before transport: numpy arrays plus deferred items (finished by the transport)."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    xs: dict[str, Deferred] = field(default_factory=dict)
