"""`shardsmith schema [KIND]`: the JSON Schema of a manifest, for an editor to check one as it is
typed (docs/PIPELINE.md, "Checking a manifest in the editor").

Built from the same declarations the manifest is read with (:mod:`pipeline.schema`): ``[dataset]``,
``[[sources]]`` (the source types of the kind, from the source registry) and each kind's
``section_types`` (the kind registry, plug-in kinds included). Without KIND, one schema for every
kind: the ``[dataset] kind`` picks the branch (draft-07 ``if``/``then``); with KIND, that kind's
alone (no conditionals: the widest editor support).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from pipeline.commands import Command
from pipeline.schema import REQUIRED, Key, keys_of

DRAFT = "http://json-schema.org/draft-07/schema#"
JSON_TYPES = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean"}
JSON_TYPES.update(table="object", list="array")
JSON_BOUNDS = {
    "minimum": "minimum",
    "maximum": "maximum",
    "exclusive_minimum": "exclusiveMinimum",
    "exclusive_maximum": "exclusiveMaximum",
}


def json_key(spec: Key) -> dict[str, Any]:
    """One key as JSON Schema (draft-07, which Taplo and VS Code's Even Better TOML read)."""
    alts: list[dict[str, Any]] = []
    for t in spec.types:
        if t in ("strings", "names", "list"):
            item: dict[str, Any] = {"type": "string", "pattern": r"\S"} if t == "names" else {}
            item |= {"type": spec.item} | ({"enum": list(spec.choices)} if spec.choices else {})
            arr = {"type": "array", "items": item, "minItems": spec.min_items or None}
            arr["uniqueItems"] = spec.unique or None
            alts += ([] if t == "list" else [item]) + [{k: v for k, v in arr.items() if v}]
        elif t == "any":
            alts.append({})
        else:
            alt: dict[str, Any] = {"type": JSON_TYPES[t]}
            if t in ("integer", "number"):
                bounds = {j: getattr(spec, k) for k, j in JSON_BOUNDS.items()}
                alt |= {k: v for k, v in bounds.items() if v is not None}
            if t == "string" and spec.choices:
                alt["enum"] = list(spec.choices)
            alts.append(alt)
    out: dict[str, Any] = alts[0] if len(alts) == 1 else {"anyOf": alts}
    if spec.default is not REQUIRED and spec.default is not None:
        out["default"] = list(spec.default) if isinstance(spec.default, tuple) else spec.default
    if spec.doc or spec.fix:
        out["description"] = spec.doc or spec.fix
    return out


def json_section(section: type | Mapping[str, Key]) -> dict[str, Any]:
    """One table: its keys, the required ones, no other key; the dataclass's docstring."""
    keys = section if isinstance(section, Mapping) else keys_of(section)
    out: dict[str, Any] = {
        "type": "object",
        "properties": {k: json_key(s) for k, s in keys.items()},
    }
    required = [k for k, s in keys.items() if s.default is REQUIRED]
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    doc = getattr(section, "__doc__", None) if not isinstance(section, Mapping) else None
    if doc:
        out["description"] = " ".join(doc.split())
    return out


def kind_schema(name: str) -> dict[str, Any]:
    """The schema of a manifest of kind ``name``."""
    from pipeline.manifest import SOURCE_HEAD, Dataset, source_keys  # import weight: --help
    from pipeline.model import KINDS, get_kind  # import weight: --help
    from pipeline.source import get_source, source_types_for  # import weight: --help

    kind = get_kind(name)
    dataset = json_section(Dataset)
    named = [name, ""] if KINDS.default == name else [name]  # "" or no kind: the default kind
    dataset["properties"]["kind"]["enum"] = named
    types = source_types_for(name)
    keys = dict(SOURCE_HEAD)
    for t in types:
        keys.update(source_keys(get_source(t)))
    source = json_section(keys)
    source["properties"]["type"]["enum"] = types
    props = {"dataset": dataset, "sources": {"type": "array", "minItems": 1, "items": source}}
    for section in kind.sections:
        declared = kind.section_types.get(section)
        props[section] = json_section(declared) if declared else {"type": "object"}
    return {
        "type": "object",
        "properties": props,
        "required": ["dataset", "sources"],
        "additionalProperties": False,
    }


def manifest_schema(kind: str | None = None) -> dict[str, Any]:
    """The JSON Schema of a manifest of ``kind``, or of any registered kind (None)."""
    from pipeline.model import KINDS, kind_names  # import weight: --help

    head = {"$schema": DRAFT, "title": f"shardsmith manifest{f' (kind {kind})' if kind else ''}"}
    if kind is not None:
        return head | kind_schema(kind)
    names = kind_names()
    branches = []
    for name in names:
        picked: dict[str, Any] = {"properties": {"kind": {"enum": [name]}}, "required": ["kind"]}
        if KINDS.default == name:  # also picked by a manifest that names no kind
            picked = {"properties": {"kind": {"enum": [name, ""]}}}
        branches.append({"if": {"properties": {"dataset": picked}}, "then": kind_schema(name)})
    dataset = {"type": "object", "properties": {"kind": {"enum": [*names, ""]}}}
    return head | {
        "type": "object",
        "properties": {"dataset": dataset},
        "required": ["dataset"],
        "allOf": branches,
    }


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", nargs="?", help="one dataset kind (default: every kind)")
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a plug-in module first, as [dataset] plugins does (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    from loaders.plugins import load_plugin  # import weight: --help
    from pipeline.errors import ManifestError  # import weight: --help
    from pipeline.model import kind_names  # import weight: --help

    for module in args.plugin:
        load_plugin(module, build=True)
    if args.kind is not None and args.kind not in kind_names():
        raise ManifestError(
            "shardsmith schema", "kind", f"{args.kind!r} is not one of {kind_names()}"
        )
    print(json.dumps(manifest_schema(args.kind), indent=2))
    return 0


COMMAND = Command(
    help="print the JSON Schema of a manifest (for an editor: Taplo, Even Better TOML)",
    description=__doc__.split("\n\n")[1].replace("\n", " "),
    configure=configure,
    run=run,
)
