"""Stage 5: verify a committed dataset: hashes, schema, bounds, counts and references. `inspect`
summarises it.

Everything here works from the index's schema: the fields and tables it declares, the unit counts
of the sample types it lists, the `bound` of every code field. The dataset's kind adds its own
referential checks (`Kind.check_shard`) when it is registered in this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from loaders import format as fmt
from loaders.format.digests import algorithm, tagged
from loaders.format.index_check import digest_problems
from loaders.format.readers import read_shard
from loaders.format.validate import validate_columns
from loaders.plugins import PluginError
from pipeline.model import get_kind, open_index
from pipeline.paths import inside, shard_inside


def _kind(index: fmt.Index) -> Any:

    try:
        return get_kind(index.kind)
    except ValueError:
        return None


def verify(root: str | Path, check_hashes: bool = True) -> list[str]:
    """Every problem found, as a message naming the shard; an empty list means the dataset is sound."""
    from loaders.samples import get_sample_type  # here: `build` imports this module for its summary

    problems: list[str] = []
    try:
        index = open_index(root)  # with the plug-ins it names: a fresh process checks it all
    except (fmt.FormatError, PluginError) as e:
        return [str(e)]
    problems += digest_problems(index)  # the check a ShardDataset makes at open
    kind = _kind(index)
    if kind is None:
        problems.append(
            f"{root}: kind {index.kind!r} is not registered here (its plug-in module is not imported): "
            "only the format's checks ran"
        )
    samples = []
    for name in index.samples:
        try:
            samples.append(get_sample_type(name))
        except ValueError as e:
            problems.append(f"{root}: {e}")
    fields = {f.name for f in index.fields}
    cond = index.conditions
    if cond is not None:
        cpath = index.root / cond.file
        if not inside(index.root, cond.file):  # an edited index: never read what it points at
            problems.append(f"{cpath}: the condition table's name leads outside the dataset")
        elif not cpath.exists():
            problems.append(f"{cpath}: condition table missing")
        elif check_hashes:
            try:
                if not _digest_ok(cpath, cond.digest):
                    problems.append(f"{cpath}: content hash mismatch")
            except fmt.FormatError as e:  # an algorithm this shardsmith does not know
                problems.append(f"{cpath}: {e}")
    seen: list[np.ndarray] = []
    for entry in index.shards:
        path = index.shard_path(entry)
        if not shard_inside(index.root, entry.file):
            problems.append(f"{path}: the shard's name leads outside the dataset's shards/")
            continue
        try:
            if check_hashes and not _digest_ok(path, entry.digest):
                said = entry.digest[:21]
                problems.append(f"{path}: content hash mismatch (index says {said}…)")
                continue
            cols = read_shard(path, index.encoding, fmt.shard_keys(index.fields))
            tables = _read_tables(path, index, problems)
            cols.update(tables)
            n = validate_columns(cols, index.fields, index.tables, name=str(path))
        except fmt.FormatError as e:
            problems.append(str(e))
            continue
        if n != entry.records:
            problems.append(f"{path}: index says records={entry.records}, shard has {n}")
        for st in samples:
            if any(t not in cols for t in st.tables):
                continue  # reported above as a missing table
            got, want = st.count(cols), entry.units.get(st.name)
            if got != want:
                problems.append(f"{path}: index says {st.name} units={want}, shard has {got}")
        if kind is not None:
            problems += [f"{path}: {msg}" for msg in kind.check_shard(index, cols)]
        if fmt.SAMPLE_ID in fields:
            ids = cols[fmt.SAMPLE_ID]
            seen.append(ids[cols[fmt.PRIMARY]] if fmt.PRIMARY in cols else ids)
    if seen:
        ids = np.concatenate(seen)
        if np.unique(ids).size != ids.size:
            problems.append(f"{root}: a sample_id is primary in more than one place")
        if index.primary_records is not None and ids.size != index.primary_records:
            problems.append(
                f"{root}: {ids.size} primary records, the plan placed {index.primary_records}"
            )
    return problems


def _read_tables(path: Path, index: fmt.Index, problems: list[str]) -> dict[str, np.ndarray]:
    """The declared tables one by one: a missing one is a listed problem, the others are still
    checked."""
    out = {}
    for t in index.tables:
        try:
            out.update(read_shard(path, index.encoding, [t]))
        except fmt.FormatError as e:
            problems.append(f"{path}: declared table {t!r} unreadable or missing ({e})")
    return out


def summary(root: str | Path) -> dict[str, Any]:

    index = open_index(root)
    splits: dict[str, dict[str, Any]] = {}
    for e in index.shards:
        s = splits.setdefault(
            e.split, {"shards": 0, "records": 0, "units": {}, "bytes": 0, "raw_bytes": 0}
        )
        s["shards"] += 1
        s["records"] += e.records
        s["bytes"] += e.bytes
        s["raw_bytes"] += e.raw_bytes
        for k, v in e.units.items():
            s["units"][k] = s["units"].get(k, 0) + int(v)
    total_bytes = sum(e.bytes for e in index.shards)
    raw = sum(e.raw_bytes for e in index.shards)
    kind = _kind(index)
    return {
        "name": index.name,
        "kind": index.kind,
        "encoding": index.encoding,
        "codec": index.codec or None,
        "samples": list(index.samples),
        "fields": [f.to_json() for f in index.fields],
        "tables": list(index.tables),
        "splits": splits,
        "vocabulary_sizes": {f: len(v) for f, v in index.vocabularies.items()},
        "vocabularies": index.vocabularies,
        "bytes": total_bytes,
        "raw_bytes": raw,
        "compression_ratio": round(raw / total_bytes, 3) if total_bytes else None,
        "skipped": index.stats.get("skipped", {}),
        "sources": len(index.sources),
        "plugins": list(index.plugins),
        "details": kind.describe(index) if kind is not None else {},
        "warnings": kind.warnings(index) if kind is not None else [],
    }


def _truncated(labels: list[str], n: int, width: int = 72) -> str:
    """As many labels as fit in ``width`` characters, then how many more there are."""
    shown: list[str] = []
    used = 0
    for label in labels:
        if shown and used + len(label) + 2 > width:
            break
        shown.append(label)
        used += len(label) + 2
    rest = n - len(shown)
    return ", ".join(shown) + (f", ... (+{rest} more)" if rest > 0 else "")


def format_summary(s: dict[str, Any]) -> str:
    codec = s["codec"]["name"] if s.get("codec") else ""
    lines = [
        f"{s['name']} ({s['kind']}, {s['encoding']} {codec}): {s['sources']} sources; "
        f"sample types: {', '.join(s['samples']) or '-'}"
    ]
    samples = s["samples"]
    lines.append(
        f"  {'split':6} {'shards':>6} {'records':>9} "
        + " ".join(f"{n:>10}" for n in samples)
        + f" {'MB':>8}"
    )
    for name, v in s["splits"].items():
        lines.append(
            f"  {name:6} {v['shards']:6d} {v['records']:9d} "
            + " ".join(f"{v['units'].get(n, 0):10d}" for n in samples)
            + f" {v['bytes'] / 1e6:8.2f}"
        )
    if s["vocabulary_sizes"]:
        lines.append("  vocabularies (code order; all of them: inspect --json):")
        lines += [
            f"    {k} ({n}): {_truncated(s.get('vocabularies', {}).get(k, []), n)}"
            for k, n in s["vocabulary_sizes"].items()
        ]
    lines.append(
        f"  bytes: {s['bytes'] / 1e6:.2f} MB stored, {s['raw_bytes'] / 1e6:.2f} MB raw "
        f"(compression ratio {s['compression_ratio']})"
    )
    if s.get("plugins"):
        lines.append(f"  plug-ins (imported to read it): {', '.join(s['plugins'])}")
    if s["skipped"]:
        lines.append("  skipped: " + ", ".join(f"{k}={v}" for k, v in s["skipped"].items()))
    if s["details"]:
        lines += get_kind(s["kind"]).describe_lines(s["details"])
    lines += [f"  warning: {w}" for w in s.get("warnings", [])]
    return "\n".join(lines)


def _digest_ok(path: Path, digest: str) -> bool:
    """Whether ``path``'s content has ``digest``, hashed with the algorithm it names (xxh3-128, or
    sha256 in an index of version 1-3); an algorithm this shardsmith does not know is a
    ``FormatError`` naming the known ones."""
    return fmt.content_hash(path, algorithm(digest)) == tagged(digest)
