"""The sample-type registry (torch-free). Built-in types register on import; plug-ins register with
:func:`register_sample_type` in their own module (see docs/EXTENDING.md)."""

from __future__ import annotations

from loaders.samples import ct as _ct  # noqa: F401,E402  (registers ct)
from loaders.samples import perturbation as _perturbation  # noqa: F401,E402  (registers cells, pairs, sentences)
from loaders.samples import spike as _spike  # noqa: F401,E402  (registers spike)
from loaders.samples.base import SAMPLE_TYPES, SampleType, from_config, get_sample_type, register_sample_type

__all__ = ["SAMPLE_TYPES", "SampleType", "from_config", "get_sample_type", "register_sample_type"]
