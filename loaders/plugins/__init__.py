"""Finding modalities: the ``shardsmith.modalities`` entry-point group and the modules a dataset
names.

A modality is a *loader module* (torch-free, never imports ``pipeline``) that registers its
sample types, deferred ops and field codecs on import, and may name its *build module* in
``BUILD_MODULE`` (kinds, sources, demo writers, commands). Built-ins and installed plug-ins are
entry points (``pyproject.toml``: ``[project.entry-points."shardsmith.modalities"]``, the way
numcodecs finds codecs); a manifest's ``[dataset] plugins`` and the ``plugins`` an ``index.json``
records are loader modules too. Readers import loader modules only; the pipeline also imports
each ``BUILD_MODULE``.

Importing a module runs its code, and an ``index.json`` is data anyone who can write its folder or
bucket controls. So a reader imports a module an index names only when it is installed as a
modality (an entry point, a built-in), is already imported in this process, or the caller allowed
it, the way Hugging Face's ``trust_remote_code`` works: ``trust_plugins=`` (``ShardDataset``,
``read_index``), ``--trust-plugins`` (the commands) or ``$SHARDSMITH_TRUST_PLUGINS`` (a comma
list of module names, or ``1`` for any). An allowance given as an argument is written into that
environment variable, so every process started afterwards (the decoder process, DataLoader
workers, ranks) inherits it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import sys
from collections.abc import Iterable, Sequence
from functools import cache
from importlib.metadata import entry_points
from types import ModuleType

GROUP = "shardsmith.modalities"
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
TRUST_ENV = "SHARDSMITH_TRUST_PLUGINS"
TRUST_ANY = ("1", "*", "all", "true", "yes")  # the variable's values that allow any module
TRUST_NONE = ("", "0", "false", "no")  # and those that allow none


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


def trusted() -> tuple[bool, frozenset[str]]:
    """``(any module allowed, the modules allowed)`` by ``$SHARDSMITH_TRUST_PLUGINS``."""
    raw = os.environ.get(TRUST_ENV, "").strip()
    if raw.lower() in TRUST_ANY or raw.lower() in TRUST_NONE:
        return raw.lower() in TRUST_ANY, frozenset()
    return False, frozenset(m.strip() for m in raw.split(",") if m.strip())


def allow_plugins(modules: Iterable[str]) -> None:
    """The caller's allowance of ``modules``, added to ``$SHARDSMITH_TRUST_PLUGINS`` so that the
    processes this one starts from now on inherit it (a fresh decoder process, spawned workers
    read the index again)."""
    every, names = trusted()
    wanted = names | {str(m) for m in modules}
    if not every and wanted != names:
        os.environ[TRUST_ENV] = ",".join(sorted(wanted))


def check_plugins_allowed(
    modules: Sequence[str], trust: bool | Iterable[str] = False, needed_by: str = ""
) -> None:
    """Refuse (:class:`PluginError`, saying how to allow them) the ``modules`` a dataset names
    that no one allowed: not an installed modality, not imported already (importing it again runs
    nothing), not in ``trust`` (``True``: every one of ``modules``) nor in the environment. What
    ``trust`` allows is then allowed in the environment too (:func:`allow_plugins`)."""
    if trust is True:
        allow_plugins(modules)
    elif isinstance(trust, str):  # one name, not its letters
        allow_plugins([trust])
    elif trust:
        allow_plugins(trust)
    every, names = trusted()
    installed = {m for _, m in modality_modules()}
    refused = [
        m
        for m in modules
        if not (every or m in names or m in installed or sys.modules.get(m) is not None)
    ]
    if refused:
        listed = ",".join(refused)
        raise PluginError(
            f"{needed_by or 'the dataset'} names the plug-in module(s) {listed}, which are not "
            "installed shardsmith modalities: importing one runs its code, so it is imported only "
            "if you trust this dataset. To allow it, pass trust_plugins=True (or "
            f"trust_plugins=[{', '.join(map(repr, refused))}]) to ShardDataset / read_index, "
            f"--trust-plugins to the shardsmith command, or set {TRUST_ENV}={listed} (inherited "
            "by the decoder process and DataLoader workers); an installed plug-in package (a "
            "shardsmith.modalities entry point) needs none of these"
        )


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
