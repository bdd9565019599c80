"""`loaders.ops` is :mod:`loaders.samples.ops` (the sample-type API: docs/EXTENDING.md names this
path, so it stays; the same module object, not a copy)."""

import sys

from loaders.samples import ops as _module

sys.modules[__name__] = _module
