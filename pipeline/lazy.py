"""Modules imported on first attribute access.

Why: the registries (sources, kinds) import every plug-in module to read its declarations (a
source's ``type``, ``kinds`` and ``suffixes``) as soon as a manifest is parsed, and a no-change
rebuild stops right after that (a few stat calls). A source module's reading libraries (h5py,
pandas, scipy) therefore must not load when the module is imported, only when the source first
reads: ``h5py = LazyModule("h5py")`` at module level (under ``if not TYPE_CHECKING``) keeps the
code as written (``h5py.File(...)``, ``isinstance(x, h5py.Group)``) while the import happens on
first use. Nothing is put in ``sys.modules`` until then, so other modules importing the library
the ordinary way are not affected.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """A stand-in for ``import name`` whose attributes come from the real module, imported on first
    access."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
