"""One registry helper for every plug-in point (kinds, sources, writers, readers, backends,
commands, field codecs, sample types, deferred ops, demo writers): ``register`` / ``get`` / a
typed "unknown X" error.

Why one class: ten hand-rolled dicts each had their own error text and their own way of importing
built-ins. A registry here holds objects, or *lazy* entries (a module that registers the name
when imported, so a CT kind's scipy.ndimage is paid only by CT builds), and may call a
``discover`` hook on a miss: the modality entry points (:mod:`loaders.plugins`). Modelled on
numcodecs' ``register_codec`` / ``get_codec``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A name no plug-in registered; the message lists the known names."""


class Registry(Generic[T]):
    """Name -> object. ``what`` names the thing in errors ("dataset kind", "sample type")."""

    def __init__(
        self,
        what: str,
        discover: Callable[[], None] | None = None,
        error: type[Exception] = UnknownNameError,
        ordered: bool = False,
    ) -> None:
        self.what = what
        self._ordered = ordered  # names() in registration order (e.g. backends, cheapest first)
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}
        self._discover = discover
        self._error = error
        self.default: str | None = None

    def register(self, name: str, item: T) -> T:
        """Make ``item`` available as ``name`` (a later registration of the same name replaces it)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"a {self.what} needs a non-empty name, got {name!r}")
        self._items[name] = item
        self._lazy.pop(name, None)
        return item

    def register_lazy(self, name: str, module: str) -> None:
        """``name`` is registered by importing ``module`` (imported on the first ``get(name)``)."""
        if name not in self._items:
            self._lazy[name] = module

    def set_default(self, name: str) -> None:
        """The name a caller gets when it names none (e.g. a manifest without ``[dataset] kind``)."""
        self.default = name

    def peek(self, name: str) -> T | None:
        """The object registered as ``name`` if it is loaded already (no discovery, no import)."""
        return self._items.get(name)

    def discover(self) -> None:
        if self._discover is not None:
            self._discover()

    def _resolve(self, name: str) -> None:
        module = self._lazy.get(name)
        if module is None:
            return
        importlib.import_module(module)
        if name not in self._items:
            self._lazy.pop(name, None)
            raise self._error(
                f"{self.what} {name!r}: module {module!r} was to register it and did not"
            )

    def get(self, name: str, *default: T) -> T:
        """The object registered as ``name``; unknown -> the registry's error listing the known
        names."""
        if name not in self._items and name not in self._lazy:
            self.discover()
        self._resolve(name)
        try:
            return self._items[name]
        except KeyError:
            if default:
                return default[0]
            raise self._error(
                f"unknown {self.what} {name!r} (known: {', '.join(self.names()) or 'none'})"
            ) from None

    def names(self) -> list[str]:
        """Every registered name, lazy ones included, without importing them."""
        self.discover()
        names = [*self._items, *(n for n in self._lazy if n not in self._items)]
        return names if self._ordered else sorted(names)

    def load_all(self) -> dict[str, T]:
        """Every entry resolved (imports the lazy modules): for lookups by an attribute (suffix,
        kind)."""
        self.discover()
        for name in list(self._lazy):
            self._resolve(name)
        return dict(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items) + len(self._lazy)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self.load_all().items())

    def __setitem__(self, name: str, item: T) -> None:
        self.register(name, item)

    def __delitem__(self, name: str) -> None:
        self._items.pop(name, None)
        self._lazy.pop(name, None)
