"""A cell-load experiment file (the TOML that ``[split] cellload_toml`` names): read and checked
when the manifest loads, errors naming the file and the key to fix.

Apart from :mod:`.split_config` (the ``[split]`` keys) because it reads another tool's file
format from disk, as a source reader reads its file; :mod:`.cellload` assigns the splits it
describes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.errors import ManifestError
from pipeline.modalities.perturbation.split_config import Experiment, parse_fewshot_entry
from pipeline.schema import Key, check, toml_table

TABLES = ("datasets", "training", "zeroshot", "fewshot")  # of a cell-load experiment
TABLE, STRING = Key("table"), Key("string")
ZEROSHOT = Key("string", choices=("train", "val", "test"))


def load_experiment(manifest: Path, rel: str) -> Experiment:
    """Read and check a cell-load experiment file, with errors naming the file and the key to fix."""
    path = (manifest.parent / rel).resolve()
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ManifestError(
            manifest,
            "split.cellload_toml",
            f"cannot read {path} ({e.strerror or e}); the path is relative to the manifest",
        ) from None
    raw = toml_table(path, data)
    unknown = sorted(set(raw) - set(TABLES))
    if unknown:
        raise ManifestError(
            path,
            unknown[0],
            "unknown table (a cell-load experiment has [datasets], [training], "
            "[zeroshot], [fewshot])",
        )
    tables = {name: check(path, name, raw.get(name, {}), TABLE) for name in TABLES}
    for name in ("datasets", "training", "zeroshot"):
        for k, v in tables[name].items():
            check(path, f"{name}.{k}", v, ZEROSHOT if name == "zeroshot" else STRING)
    for name, k in ((n, k) for n in ("zeroshot", "fewshot") for k in tables[n]):
        if "." not in k:
            raise ManifestError(path, f"{name}.{k}", 'keys are "dataset.celltype"')
    fewshot = {
        k: parse_fewshot_entry(path, f"fewshot.{k}", v) for k, v in tables["fewshot"].items()
    }
    exp = Experiment(
        path,
        hashlib.sha256(data).hexdigest(),
        dict(tables["datasets"]),
        dict(tables["training"]),
        dict(tables["zeroshot"]),
        fewshot,
    )
    missing = sorted(exp.used() - set(exp.datasets))
    if missing:
        raise ManifestError(
            path,
            "datasets",
            f"no path for dataset(s) {missing}: add e.g. {missing[0]} = "
            '"/path/to/folder/" under [datasets]',
        )
    return exp
