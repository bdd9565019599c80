"""What makes a rebuild cheap: a record, next to index.json, of what produced it.

`OUT/.build-inputs.json` holds the digest of all inputs of the committed build and, per source,
the key of everything that source's shards depend on
(`pipeline.modalities.perturbation.plan.source_key`) with its pairing stats. It names the sha256
of the index it belongs to, so a record left by an older or interrupted build is never trusted;
it is a cache, never required: without it the build simply plans everything.

* no change (`unchanged`): every source's (size, mtime, inode, ctime) is as the record's stat
  cache ("stats") holds it with its digest (the scan's own rule for reusing a digest:
  `pipeline.fingerprint`) and the inputs digest matches: nothing is read, planned or written.
* some change (`known_sources`): sources whose key is unchanged are not planned again; their shards
are
  taken from the index as they are (their part numbers from `ShardEntry.part`). Vocabularies and the
  condition table are always rebuilt first,
  because a changed source can change them and with them the codes stored in every other source's
  shards.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import loaders.format
from loaders import format as fmt
from pipeline import __version__
from pipeline.fingerprint import cached, stat_key
from pipeline.manifest import Manifest
from pipeline.model import ShardPlan
from pipeline.paths import inside, shard_inside

if TYPE_CHECKING:
    from pipeline.model import Kind, KindPlan, ScannedSource, ShardPlan

INPUTS_FILE = ".build-inputs.json"


@cache
def code_digest() -> str:
    """The pipeline's own code, the format module and the libraries that decide shard bytes: a
    rebuild with other code must not be taken for a no-change rebuild, whatever the version
    string says."""

    h = hashlib.sha256()
    root, read_side = Path(__file__).parent, Path(loaders.format.__file__).parent.parent
    # read-side modules that decide stored bytes: the format (and the value types of its index), the
    # readers, the field codecs, and the modalities' own packing and codecs (e.g. a pixel-major spike
    # window)
    decides = [
        read_side / "format" / f
        for f in (
            "__init__.py",
            "values.py",
            "readers.py",
            "zarr_reader.py",
            "tar_reader.py",
            "codecs.py",
        )
    ]
    for p in [
        *sorted(root.rglob("*.py")),
        *decides,
        *sorted((read_side / "modalities").rglob("*.py")),
    ]:
        h.update(f"{p.parent.name}/{p.name}".encode() + b"\0" + p.read_bytes() + b"\0")
    libraries = ("numpy", "numcodecs", "zarr", "h5py", "anndata", "scipy")
    dists = sorted(
        name
        for folder in sys.path
        if os.path.isdir(folder)
        for name in os.listdir(folder)
        if name.endswith(".dist-info") and name.split("-")[0].lower() in libraries
    )
    h.update(
        "\0".join(dists).encode()
    )  # e.g. numcodecs-0.16.6.dist-info: cheaper than importlib.metadata
    return h.hexdigest()


def inputs_digest(manifest: Manifest, kind: Kind, sources: Sequence[tuple[str, str]]) -> str:
    """Everything a build's output depends on: manifest bytes and path, each source's (path, sha256)
    in manifest order, the kind's other input files' bytes (e.g. a perturbation feature table),
    the plug-in modules' code, and the code (`code_digest`)."""
    extra = [hashlib.sha256(p.read_bytes()).hexdigest() for p in kind.input_files(manifest)]
    doc = {
        "manifest": [str(manifest.path), manifest.sha256],
        "encoding": manifest.format,
        "sources": [list(s) for s in sources],
        "inputs": extra,
        "plugins": plugin_digest(manifest.plugins, kind),
        "code": code_digest(),
        "shardsmith": __version__,
        "format": [fmt.SHARD_VERSION, fmt.INDEX_VERSION],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def plugin_digest(modules: Sequence[str], kind: Kind) -> str:
    """The source code of plug-in modules (and of the kind's own module when it lives outside the
    pipeline)."""

    h = hashlib.sha256()
    names = sorted(
        {*modules, type(kind).__module__} - {m for m in sys.modules if m.startswith("pipeline.")}
    )
    for name in names:
        try:
            h.update(
                name.encode() + b"\0" + inspect.getsource(importlib.import_module(name)).encode()
            )
        except (OSError, TypeError, ImportError):
            h.update(name.encode())
    return h.hexdigest()


def read_record(out: Path) -> dict[str, Any]:
    """The record of the committed build, or {} when missing, unreadable or not about the current
    index."""
    try:
        saved = json.loads((out / INPUTS_FILE).read_text())
        if (
            saved.get("index_sha256")
            == hashlib.sha256(fmt.index_path(out).read_bytes()).hexdigest()
        ):
            return dict(saved)
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def unchanged(
    manifest: Manifest, kind: Kind, out: Path, prev: fmt.Index, saved: Mapping[str, Any]
) -> bool:
    """True when rebuilding would reproduce the committed dataset byte for byte, so there is nothing
    to do: every source's stat (size, mtime, inode, ctime) as the stat cache recorded it with its
    digest (pipeline.fingerprint), the same inputs digest, every named file present."""
    if not saved:
        return False
    try:
        stats = dict(saved.get("stats") or {})
        sources = []
        for spec in manifest.sources:
            key = stat_key(spec.path, kind.source_companions(manifest, spec))
            digest = cached(stats.get(str(spec.path)), key)
            if digest is None:
                return False
            sources.append((str(spec.path), digest))
        if saved.get("inputs") != inputs_digest(manifest, kind, sources):
            return False
        # a name leading outside OUT (a tampered index) is no file of this dataset: rebuild
        if not all(shard_inside(out, s.file) for s in prev.shards) or (
            prev.conditions is not None and not inside(out, prev.conditions.file)
        ):
            return False
        files = [out / fmt.SHARDS_DIR / s.file for s in prev.shards]
        side = [out / prev.conditions.file] if prev.conditions is not None else []
        return all(p.exists() for p in [*files, *side])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def known_sources(
    out: Path, prev: fmt.Index, saved: Mapping[str, Any]
) -> dict[str, tuple[list[ShardPlan], dict[str, int]]]:
    """Source key -> (that source's shards in the committed index, as stubs; its planning stats),
    for the sources whose shard files all exist."""

    by_source: dict[int, list[fmt.ShardEntry]] = {}
    for s in prev.shards:
        by_source.setdefault(s.source, []).append(s)
    known = {}
    try:
        for key, info in dict(saved.get("sources", {})).items():
            entries = by_source.get(int(info["ordinal"]), [])
            if entries and all(
                shard_inside(out, e.file) and (out / fmt.SHARDS_DIR / e.file).exists()
                for e in entries
            ):
                stubs = [
                    ShardPlan(e.split, e.source, e.part, np.zeros(0, np.int64), {}, e.plan_key)
                    for e in entries
                ]
                known[key] = (stubs, {k: int(v) for k, v in info["stats"].items()})
    except (KeyError, TypeError, ValueError):
        return {}
    return known


def save_inputs(
    out: Path, manifest: Manifest, kind: Kind, scanned: Sequence[ScannedSource], plan: KindPlan
) -> None:
    """After a commit: remember what produced it (a cache: written atomically, never required)."""
    digest = inputs_digest(
        manifest, kind, [(str(s.spec.path), s.fingerprint.digest) for s in scanned]
    )
    doc = {
        "index_sha256": hashlib.sha256(fmt.index_path(out).read_bytes()).hexdigest(),
        "inputs": digest,
        "sources": {
            k: {"ordinal": i, "stats": st}
            for i, (k, st) in enumerate(zip(plan.source_keys, plan.source_stats, strict=True))
        },
        # the stat cache: what vouches for each source's digest on the next build
        "stats": {str(s.spec.path): s.fingerprint.stat_json() for s in scanned},
    }
    fmt.atomic_write_bytes(out / INPUTS_FILE, json.dumps(doc, sort_keys=True).encode())
