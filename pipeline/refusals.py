"""The build's refusals: two kinds of bad input that a build would otherwise commit, exiting 0.

* another dataset in ``--out`` (`check_same_dataset`): a manifest of another name or kind pointed
  at an existing dataset's folder would retire all of its shards;
* nothing kept (`check_kept`): a build whose every record was skipped, or that found none, would
  replace a good dataset with an empty one.

Why a module of its own: each is a decision about the build's input and what OUT already holds,
made before anything is written or before the commit; neither needs any stage of the build itself
(:mod:`pipeline.build`), and both are documented as reliability points (docs/PIPELINE.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from loaders import format as fmt
from pipeline.errors import NothingKeptError, OutputError
from pipeline.manifest import Manifest
from pipeline.model import PackResult


def check_same_dataset(
    out: Path, prev: fmt.Index | None, manifest: Manifest, replace: bool
) -> None:
    """Refuse to build one dataset over another: a manifest of another name or kind pointed at an
    existing dataset's folder (a copied command line, a wrong --out) would retire all of its
    shards and report success. ``replace`` (``--replace``) says it is meant. An index this build
    cannot read (a plug-in the manifest no longer names) is compared by its raw name and kind."""
    if replace:
        return
    if prev is not None:
        held = (prev.name, prev.kind)
    else:
        try:
            doc = json.loads(fmt.index_path(out).read_bytes())
        except (OSError, ValueError):
            return  # no index: nothing to replace
        if not isinstance(doc, dict):
            return
        held = (str(doc.get("name")), str(doc.get("kind")))
    if held == (manifest.name, manifest.kind):
        return
    raise OutputError(
        f"--out {out} holds dataset {held[0]!r} (kind {held[1]}), and {manifest.path} builds "
        f"dataset {manifest.name!r} (kind {manifest.kind}): a build there would replace it. "
        f"Pass another --out (e.g. shards/{manifest.name}), or --replace to replace it "
        "(nothing was changed)"
    )


def check_kept(
    manifest: Manifest,
    out: Path,
    prev: fmt.Index | None,
    reused: dict[int, fmt.ShardEntry],
    results: list[PackResult],
) -> None:
    """Refuse to commit a dataset without a record: every record skipped (a CT volume normalised to
    [0, 1], spike ``frames`` larger than the files hold) or none found. Committed, it would replace
    a good dataset with an empty one and exit 0, so it is bad input, naming the skip reasons as
    the index would have counted them."""
    kept = sum(e.records for e in reused.values()) + sum(r.entry.records for r in results)
    if kept:
        return
    skipped: dict[str, int] = {}
    for r in results:
        for reason, n in r.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + int(n)
    what = (
        f"all {sum(skipped.values())} records were skipped: "
        + "; ".join(f"{n} x {reason!r}" for reason, n in sorted(skipped.items()))
        if skipped
        else "the sources hold no records"
    )
    left = (
        f"the dataset {prev.name!r} in {out} is untouched"
        if prev is not None
        else f"{out} holds no dataset"
    )
    raise NothingKeptError(
        f"{manifest.path}: the build kept no record ({what}): nothing was committed and {left}. "
        "Fix the sources or the manifest settings the reasons name (the log names each record)"
    )
