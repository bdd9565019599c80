"""`loaders.device` is :mod:`loaders.engine.device` (device feeding and the torch-finisher registry:
docs/EXTENDING.md names this path, so it stays; the same module object, not a copy)."""

import sys

from loaders.engine import device as _module

sys.modules[__name__] = _module
