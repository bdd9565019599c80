"""The manifest's schema: every section is a frozen dataclass whose fields declare its keys once
(:func:`key`: type, default, allowed values, bounds, what it is), one validator reads a TOML table
against such a dataclass (:func:`read`), and `shardsmith schema` (:mod:`pipeline.commands.schema`)
turns the same declarations into the JSON Schema an editor checks a manifest with.

Why dataclasses and not pydantic or msgspec: the messages are ours ("file: [section.key] problem,
and the fix", did-you-mean included), which a library's error text would have to be mapped back
to, and `shardsmith --help` and a no-change rebuild would pay its import (pydantic: ~0.1-0.2 s
here; this module: stdlib only). Every bound is written so that NaN fails it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from operator import ge, gt, le, lt
from pathlib import Path
from typing import Any

import tomllib

from pipeline.errors import ManifestError

REQUIRED: Any = ...  # the default of a key the manifest must set
# key type -> (the Python types a TOML value of it has, what the message calls it)
TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "string": ((str,), "a string"),
    "integer": ((int,), "an integer"),
    "number": ((int, float), "a number"),
    "boolean": ((bool,), "true or false"),
    "table": ((dict,), "a table"),
    "list": ((list,), "a list"),
    "strings": ((str, list), "a string or a list of strings"),  # a bare string: a list of one
    "names": ((str, list), "a list of names"),  # strings, none empty (columns, keys, files)
    "any": ((object,), "a value"),
}
OPS: dict[str, Callable[[Any, Any], bool]] = {">=": ge, "<=": le, ">": gt, "<": lt}


@dataclasses.dataclass(frozen=True)
class Key:
    """One manifest key. ``type`` is a name of :data:`TYPES` or a tuple of them (a union);
    ``choices`` bound a string, or each item of a list; ``fix`` says how to mend a value out of
    bounds; ``convert`` maps the checked value to the one the config holds."""

    type: str | tuple[str, ...]
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    finite: bool = False
    min_items: int = 0
    unique: bool = False
    fix: str = ""
    convert: Callable[[Any], Any] | None = None
    item: str = "string"  # the JSON type of a "list" key's items

    def initial(self) -> Any:
        """The value of an absent key: its default, copied and converted."""
        v = type_copy(self.default) if isinstance(self.default, list | dict) else self.default
        return self.convert(v) if self.convert is not None and v is not None else v

    @property
    def types(self) -> tuple[str, ...]:
        return (self.type,) if isinstance(self.type, str) else self.type


def key(type: str | tuple[str, ...], default: Any = REQUIRED, **kw: Any) -> Any:
    """A dataclass field that is a manifest key (a field without it is derived, not read)."""
    spec = Key(type, default, **kw)
    dflt = None if default is REQUIRED else spec.initial()
    if isinstance(dflt, list | dict):
        return dataclasses.field(default_factory=lambda: type_copy(dflt), metadata={"key": spec})
    return dataclasses.field(default=dflt, metadata={"key": spec})


def or_none(v: Any) -> Any:
    """A ``convert`` for a key whose empty value ("", 0) means unset (None)."""
    return v or None


def type_copy(v: Any) -> Any:
    return list(v) if isinstance(v, list) else dict(v)


@functools.cache
def keys_of(section: type) -> dict[str, Key]:
    """The keys a section dataclass declares, in declaration order (the order they are checked)."""
    return {f.name: f.metadata["key"] for f in dataclasses.fields(section) if "key" in f.metadata}


def near(word: Any, known: Any) -> str:
    """ "; did you mean 'x'?" for a string close to one of ``known``, else ""."""
    if not isinstance(word, str):
        return ""
    import difflib  # only on an error: `shardsmith --help` and a no-change rebuild skip its import

    close = difflib.get_close_matches(word, [str(k) for k in known], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def toml_table(path: Path, data: bytes) -> dict[str, Any]:
    """``data``, the bytes of the TOML file ``path``, as a table; else ManifestError naming the
    file."""
    try:
        return tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(path, "-", f"not valid TOML: {e}") from None
    except RecursionError:
        raise ManifestError(
            path, "-", "not a manifest: arrays or tables nested too deeply to read"
        ) from None


def read(
    path: str | Path, name: str, data: Any, section: type | Mapping[str, Key]
) -> dict[str, Any]:
    """The one validator: ``data`` (a TOML table, None when absent) checked against ``section``'s
    keys, defaults filled in and values converted; a bad value raises ManifestError naming
    ``name.key``. A Mapping section (name -> Key) serves tables whose keys are known only at run
    time (``[[sources]]`` options)."""
    keys = section if isinstance(section, Mapping) else keys_of(section)
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ManifestError(path, name, "must be a table")
    unknown = sorted(set(data) - set(keys))
    if unknown:
        listed = ", ".join(sorted(keys))
        hint = near(unknown[0], keys)
        raise ManifestError(path, f"{name}.{unknown[0]}", f"unknown key{hint} (known: {listed})")
    out = {}
    for k, spec in keys.items():
        if k not in data:
            if spec.default is REQUIRED:
                raise ManifestError(
                    path, f"{name}.{k}", "is required" + (f" ({spec.doc})" if spec.doc else "")
                )
            out[k] = spec.initial()
        else:
            out[k] = check(path, f"{name}.{k}", data[k], spec)
    return out


def check(path: str | Path, where: str, v: Any, spec: Key) -> Any:
    """One value against its key: type, bounds, choices; the converted value."""

    def bad(problem: str) -> ManifestError:
        hint = spec.fix or spec.doc
        return ManifestError(path, where, f"{problem} ({hint})" if hint else problem)

    types = spec.types
    if not any(
        isinstance(v, TYPES[t][0]) and (t in ("boolean", "any") or not isinstance(v, bool))
        for t in types
    ):
        got = "a boolean" if isinstance(v, bool) else f"{type(v).__name__} {v!r}"
        raise bad(f"expected {' or '.join(TYPES[t][1] for t in types)}, got {got}")
    if isinstance(v, int | float) and not isinstance(v, bool):
        bounds = [(">=", spec.minimum), ("<=", spec.maximum)]
        bounds += [(">", spec.exclusive_minimum), ("<", spec.exclusive_maximum)]
        bounds = [(op, b) for op, b in bounds if b is not None]
        if spec.minimum is not None and spec.maximum is not None and len(bounds) == 2:
            allowed = f"in {spec.minimum}..{spec.maximum}"  # the wording manifests always used
        else:
            allowed = " and ".join(f"{op} {b}" for op, b in bounds)
        if spec.finite and not math.isfinite(v):
            raise bad(f"{v!r} is not a finite number{' ' + allowed if allowed else ''}")
        if not all(OPS[op](v, b) for op, b in bounds):  # NaN fails every comparison
            raise bad(f"{v!r} is outside the allowed values: must be {allowed}")
    if isinstance(v, str) and spec.choices and "list" not in types and v not in spec.choices:
        raise bad(f"{v!r} is not one of {list(spec.choices)}{near(v, spec.choices)}")
    if isinstance(v, list) or (isinstance(v, str) and {"strings", "names"} & set(types)):
        v = items(bad, [v] if isinstance(v, str) else v, spec)
    return spec.convert(v) if spec.convert is not None else v


def items(bad: Callable[[str], ManifestError], v: list[Any], spec: Key) -> Any:
    """A list's items: strings (for string-list types and choices), none empty for ``names``."""
    if ({"strings", "names"} & set(spec.types) or spec.choices) and not all(
        isinstance(s, str) for s in v
    ):
        raise bad("must be a list of strings")
    if "names" in spec.types:
        for s in v:
            if not s.strip():
                raise bad(
                    f'has an empty name ({s!r}): list the names, as key = ["..."], or leave it out for none'
                )
    if spec.choices and any(s not in spec.choices for s in v):
        raise bad(f"expected names among {list(spec.choices)}, got {v!r}")
    if len(v) < spec.min_items or (spec.unique and len(set(map(repr, v))) != len(v)):
        how = "distinct " if spec.unique else ""
        least = "one" if spec.min_items == 1 else str(spec.min_items)
        raise bad(
            f"expected at least {least} {how}item{'s' if spec.min_items > 1 else ''}, got {v!r}"
        )
    return tuple(v) if {"strings", "names"} & set(spec.types) else v
