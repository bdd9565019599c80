"""Cost of the index digest check a loader runs at open (issue 25, items 6-7), against reading the
index: synthetic ``index.json`` files scaled from a real perturbation build's index (more shards, genes
and labels), median of 7 in one process.

    python -m benchmarks.experiments.loader.digest_cost BUILT_DATASET [--work DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loaders import format as fmt
from loaders.format.index_check import check_index_digest

SIZES = ((50, 2000, 100), (1000, 20000, 2000), (10000, 60000, 20000), (100000, 60000, 100000))


def scaled(base: dict[str, Any], n_shards: int, n_genes: int, n_labels: int) -> dict[str, Any]:
    """``base`` with ``n_shards`` shard entries, ``n_genes`` var names and ``n_labels`` labels."""
    doc = copy.deepcopy(base)
    e0 = doc["shards"][0]
    doc["shards"] = [
        dict(e0, file=f"shard-{i:06d}.zarr", digest=f"xxh3_128:{i:032x}", part=i)
        for i in range(n_shards)
    ]
    doc["sections"][doc["kind"]]["var_names"] = [f"ENSG{i:011d}" for i in range(n_genes)]
    doc["vocabularies"] = {k: [f"{k}_{i}" for i in range(n_labels)] for k in doc["vocabularies"]}
    doc.pop("digest", None)
    doc["digest"] = fmt.index_digest(doc)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dataset", type=Path, help="a built perturbation dataset (its index.json)")
    ap.add_argument(
        "--work", type=Path, default=None, help="where the scaled indexes go (a tmp dir)"
    )
    a = ap.parse_args(argv)
    base = json.loads((a.dataset / "index.json").read_text())
    work = a.work or Path(tempfile.mkdtemp(prefix="digest-cost-"))
    for n_shards, n_genes, n_labels in SIZES:
        root = work / f"idx_{n_shards}"
        root.mkdir(parents=True, exist_ok=True)
        data = json.dumps(scaled(base, n_shards, n_genes, n_labels), indent=1).encode()
        (root / "index.json").write_bytes(data)
        t_read, t_check = [], []
        for _ in range(7):
            t0 = time.perf_counter()
            index = fmt.read_index(root, data)
            t1 = time.perf_counter()
            check_index_digest(index)
            t_read.append(t1 - t0)
            t_check.append(time.perf_counter() - t1)
        print(
            f"shards={n_shards:>6} var_names={n_genes:>6} labels={n_labels:>6} "
            f"index.json={len(data) / 1e6:6.1f} MB  read_index="
            f"{statistics.median(t_read) * 1e3:7.1f} ms  "
            f"digest check={statistics.median(t_check) * 1e3:7.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
