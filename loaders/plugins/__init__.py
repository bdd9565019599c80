"""Finding modalities: the ``shardsmith.modalities`` entry-point group and the modules a dataset
names.

A modality is a *loader module* (torch-free, never imports ``pipeline``) that registers its
sample types, deferred ops and field codecs on import, and may name its *build module* in
``BUILD_MODULE`` (kinds, sources, demo writers, commands). Built-ins and installed plug-ins are
entry points (``pyproject.toml``: ``[project.entry-points."shardsmith.modalities"]``, the way
numcodecs finds codecs); a manifest's ``[dataset] plugins`` and the ``plugins`` an ``index.json``
records are loader modules too. Readers import loader modules only; the pipeline also imports
each ``BUILD_MODULE``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import cache
from importlib.metadata import entry_points
from types import ModuleType

GROUP = "shardsmith.modalities"
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class PluginError(ImportError):
    """A plug-in module a dataset or manifest needs cannot be imported; the message says how to fix
    it."""


@cache
def modality_modules() -> tuple[tuple[str, str], ...]:
    """(name, loader module) of every installed modality, in name order: the entry points, and the
    subpackages of ``loaders.modalities`` (the built-ins), so that a checkout used through
    ``PYTHONPATH`` without ``pip install`` (no entry-point metadata: a GPU node, a cluster's
    shared folder) finds them too."""
    found = {ep.name: ep.value.split(":")[0] for ep in entry_points(group=GROUP)}
    builtin = importlib.import_module("loaders.modalities")
    for info in pkgutil.iter_modules(builtin.__path__):
        if info.ispkg:
            found.setdefault(info.name, f"{builtin.__name__}.{info.name}")
    return tuple(sorted(found.items()))


def load_plugin(module: str, build: bool = False, needed_by: str = "") -> ModuleType:
    """Import a loader module (and, with ``build``, its ``BUILD_MODULE``). A module that is missing
    itself, or a name that is no module name (``../evil``), is a :class:`PluginError` naming it
    and the fix; an error inside the module propagates unchanged."""
    if not isinstance(module, str) or not MODULE_NAME.fullmatch(module):
        raise PluginError(
            f"{module!r} is not a Python module name (dotted identifiers, e.g. 'pointclouds' or "
            "'mylab.clouds'): put the plug-in's folder on PYTHONPATH and name its module"
        )
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise
        who = f"{needed_by} needs" if needed_by else "needs"
        raise PluginError(
            f"{who} the plug-in module {module!r}, which is not importable here: install the "
            f"package that provides it (pip install ...) or put its folder on PYTHONPATH"
        ) from None
    target = getattr(mod, "BUILD_MODULE", None)
    if build and target:
        importlib.import_module(target)
    return mod


_done: set[bool] = set()


def load_modalities(build: bool = False) -> None:
    """Import every installed modality once per process (its loader module; with ``build`` its build
    module)."""
    if build in _done:
        return
    for name, module in modality_modules():
        load_plugin(module, build=build, needed_by=f"the installed modality {name!r}")
    _done.add(build)


def load_loader_modalities() -> None:
    load_modalities(build=False)


@cache
def format_keys() -> dict[str, str]:
    """Column and table names the installed modalities declare (their ``FORMAT_KEYS``)."""
    keys: dict[str, str] = {}
    for name, module in modality_modules():
        mod = load_plugin(module, needed_by=f"the installed modality {name!r}")
        keys.update(getattr(mod, "FORMAT_KEYS", None) or {})
    return keys


def load_build_modalities() -> None:
    load_modalities(build=True)
