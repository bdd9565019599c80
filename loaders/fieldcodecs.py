"""`loaders.fieldcodecs` is :mod:`loaders.format.codecs` (the field-codec registry: docs/EXTENDING.md
names this path, so it stays; the same module object, not a copy)."""

import sys

from loaders.format import codecs as _module

sys.modules[__name__] = _module
