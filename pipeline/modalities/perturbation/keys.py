"""The two keys of a perturbation plan's reuse: a shard's plan key (its name, and whether a rebuild
may keep it) and a source's key (whether a rebuild may skip planning it). Kept apart from the
planner: they say what a shard's bytes depend on, which the plan's draws do not need to know."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from loaders import format as fmt
from loaders.format.digests import DIGEST, hasher
from pipeline.manifest import Manifest
from pipeline.model import ScannedSource, ShardPlan


def plan_key(shard: ShardPlan, src: ScannedSource, manifest: Manifest) -> str:
    """Hash of everything a shard's bytes depend on: source content, config, format version, planned
    columns. xxh3-128 (``loaders.format.digests``), 32 hex digits (a shard's file name starts with 16 of
    them): sha256 of the planned columns cost ~2% of a 2M-cell build's CPU. A key an older build
    wrote (64 hex digits of sha256) never equals one, so the first rebuild after the change writes
    each shard once more (the same bytes, another name)."""
    h = hasher(DIGEST)
    config = {
        "format": fmt.SHARD_VERSION,
        "encoding": manifest.format,
        "codec": [manifest.codec, manifest.codec_level],
        "source": src.fingerprint.digest,
        "matrix": src.spec.matrix,
        "values": manifest.config.fields.values,
        "obsm": list(manifest.config.fields.obsm),
    }
    h.update(json.dumps(config, sort_keys=True).encode())
    for name, a in [
        ("rows", shard.rows.astype(np.int64, copy=False)),
        *sorted(shard.columns.items()),
    ]:
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(
            np.ascontiguousarray(a)
        )  # the buffer itself: tobytes() would copy every column once more
    return str(h.hexdigest())


def source_key(manifest: Manifest, src: ScannedSource, offset: int, tables: str, salt: str) -> str:
    """Everything `plan_source` reads for one source: the manifest (all settings), the code
    (`salt`), the source's content, position and first sample id, and the dataset-wide tables
    that its codes and condition ids index (vocabularies, condition table). Equal keys mean equal
    shards for that source."""
    doc = [
        salt,
        manifest.sha256,
        src.ordinal,
        src.fingerprint.digest,
        src.spec.type,
        src.spec.matrix,
        offset,
        tables,
    ]
    experiment = manifest.config.split.experiment
    if experiment is not None:  # a file the manifest names decides the splits: its bytes count too
        doc.append(experiment.sha256)
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()
