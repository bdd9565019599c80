"""A cell-load experiment TOML reproduced cell by cell: every cell's split checked against
cell-load's rules (ArcInstitute/cell-load, PerturbationDataModule._process_celltype /
_split_fewshot_celltype):

* zeroshot "dataset.celltype" = split: perturbed cells -> split, control cells -> train;
* fewshot "dataset.celltype": listed perturbations -> val/test (test if in both), others -> train
(or by
  shardsmith's per-perturbation fractions), controls -> train;
* other cell types of a [training] dataset -> train; anything else is not used (dropped, counted).
"""

from __future__ import annotations

from collections.abc import Callable
from hashlib import sha256
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.errors import ManifestError
from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from pipeline.modalities.perturbation.splits import _by_fraction
from pipeline.seeding import stable_unit
from pipeline.verify import summary, verify

MANIFEST = """
[dataset]
name = "cellload"
kind = "perturbation"
seed = 3
shard_size_mb = 0.05

[[sources]]
path = "data/*/*.h5ad"
type = "h5ad"

[fields]
perturbation = "perturbation"
control = ["control"]
cell_type = "cell_type"
batch = "batch"
values = "counts"

[pairing]
sentence_size = 8

[split]
cellload_toml = "experiment.toml"
"""


def experiment(val: list[str], test: list[str]) -> str:
    return f"""
[datasets]
replogle = "data/replogle/"          # resolves to the manifest's source
other = "/another/machine/other/"    # another machine's path: matched by folder name

[training]
replogle = "train"

[zeroshot]
"replogle.jurkat" = "test"
"other.HepG2" = "val"

[fewshot]

[fewshot."replogle.RPE1"]
val = {val}
test = {test}
val_fraction = 0.3
test_fraction = 0.3
"""


def expected_split(
    ds: str, ct: str, pert: str, val: list[str], test: list[str], seed: int
) -> str | None:
    """cell-load's rule for one cell (None: not used by the experiment)."""
    ctrl = pert == "control"
    if (ds, ct) == ("replogle", "jurkat"):
        return "train" if ctrl else "test"
    if (ds, ct) == ("other", "HepG2"):
        return "train" if ctrl else "val"
    if (ds, ct) == ("replogle", "RPE1"):
        if ctrl:
            return "train"
        if pert in test or pert in val:
            return "test" if pert in test else "val"
        u = np.array([stable_unit(seed, "cellload", ds, ct, pert)])
        return ("train", "val", "test")[int(_by_fraction(u, 0.3, 0.3)[0])]
    return "train" if ds == "replogle" else None


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, list[Path], list[str], list[str]]:
    root = tmp_path_factory.mktemp("cellload")
    paths = [
        write_perturb_h5ad(
            root / "data" / "other" / "extra.h5ad",
            n_cells=400,
            n_genes=30,
            n_perts=8,
            cell_types=("HepG2", "A549"),
            seed=2,
        ),  # the glob's sorted order: sample ids
        write_perturb_h5ad(
            root / "data" / "replogle" / "screen.h5ad",
            n_cells=900,
            n_genes=30,
            n_perts=8,
            cell_types=("K562", "RPE1", "jurkat"),
            seed=1,
        ),
    ]
    perts = sorted(set(ad.read_h5ad(paths[1]).obs["perturbation"].astype(str)) - {"control"})
    val, test = (
        [perts[0], perts[1]],
        [perts[1], perts[2], "NOT_IN_DATA"],
    )  # perts[1] in both: test wins
    (root / "experiment.toml").write_text(experiment(val, test))
    (root / "m.toml").write_text(MANIFEST)
    build(root / "m.toml", root / "out", jobs=1, progress=False)
    return root / "out", paths, val, test


def test_every_cell_follows_cellload_rules(
    built: tuple[Path, list[Path], list[str], list[str]], read_all: Callable[..., Any]
) -> None:
    out, paths, val, test = built
    assert verify(out) == []
    index, shards = read_all(out)
    recorded = index.sections["perturbation"]["split"]
    assert recorded["mode"] == "cellload"
    exp = (out.parent / "experiment.toml").read_bytes()
    assert recorded["cellload_toml"] == {
        "path": "experiment.toml",
        "sha256": sha256(exp).hexdigest(),
    }
    obs = [ad.read_h5ad(p).obs for p in paths]
    offsets = np.cumsum([0] + [len(o) for o in obs])
    want: dict[int, str | None] = {}
    for s, (o, ds) in enumerate(zip(obs, ("other", "replogle"), strict=True)):
        for i, (ct, pert) in enumerate(
            zip(o["cell_type"].astype(str), o["perturbation"].astype(str), strict=True)
        ):
            want[int(offsets[s] + i)] = expected_split(ds, ct, pert, val, test, seed=3)
    got: dict[int, str] = {}
    for entry, cols in shards:
        for sid in cols[fmt.SAMPLE_ID][cols[fmt.PRIMARY]].tolist():
            assert sid not in got
            got[sid] = entry.split
    assert got == {k: v for k, v in want.items() if v is not None}
    assert set(got.values()) == {"train", "val", "test"}
    dropped = sum(v is None for v in want.values())
    assert dropped > 0 and index.stats["dropped"] == {
        "not used by the cell-load experiment": dropped
    }
    fractioned = {
        p for p in index.vocabularies["perturbation"] if p not in val + test + ["control"]
    }
    rpe1_held = {expected_split("replogle", "RPE1", p, val, test, 3) for p in fractioned} - {
        "train"
    }
    assert rpe1_held, "the per-perturbation fractions send some unlisted perturbation out of train"


def test_held_out_cells_pair_with_their_cell_types_train_controls(
    built: tuple[Path, list[Path], list[str], list[str]], read_all: Callable[..., Any]
) -> None:
    out, _, _, _ = built
    index, shards = read_all(out)
    ct_names = np.asarray(index.vocabularies["cell_type"])
    for entry, cols in shards:
        if entry.split == "train":
            continue
        pairs, ct = cols[fmt.PAIRS], ct_names[cols["obs/cell_type"]]
        assert pairs.shape[0] > 0
        assert (ct[pairs[:, 0]] == ct[pairs[:, 1]]).all(), (
            "controls of the same cell type (they live in train)"
        )
        assert not cols[fmt.PRIMARY][pairs[:, 0]].any()
        sc = cols[fmt.SENTENCES_CTRL]
        assert not cols[fmt.PRIMARY][sc].any()
    pairing = summary(out)["details"]["pairing"]
    assert pairing["pairs_split"] == pairing["pairs_source"] == 0


def test_experiment_errors_name_the_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(MANIFEST)
    cases = [
        ('[zeroshot]\n"replogle.jurkat" = "holdout"\n', r"zeroshot\.replogle\.jurkat.*not one of"),
        (
            '[training]\nreplogle = "train"\n',
            r"\[datasets\] no path for dataset\(s\) \['replogle'\]",
        ),
        (
            '[datasets]\nreplogle = "x"\n[fewshot."replogle.K562"]\nvals = ["A"]\n',
            r"fewshot\.replogle\.K562\.vals",
        ),
    ]
    from pipeline.manifest import load_manifest

    for text, pattern in cases:
        (tmp_path / "experiment.toml").write_text(text)
        with pytest.raises(ManifestError, match=pattern):
            load_manifest(tmp_path / "m.toml")
    (tmp_path / "m.toml").write_text(
        MANIFEST.replace(
            'cellload_toml = "experiment.toml"',
            'cellload_toml = "experiment.toml"\nmode = "zeroshot"',
        )
    )
    with pytest.raises(ManifestError, match=r"split\.mode.*not used with split\.cellload_toml"):
        load_manifest(tmp_path / "m.toml")


def test_editing_the_experiment_rebuilds_the_splits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_perturb_h5ad(
        tmp_path / "data" / "replogle" / "screen.h5ad",
        n_cells=300,
        n_genes=20,
        n_perts=4,
        cell_types=("K562", "jurkat"),
        seed=1,
    )
    exp = '[datasets]\nreplogle = "data/replogle/"\n[training]\nreplogle = "train"\n[zeroshot]\n"replogle.jurkat" = '
    (tmp_path / "experiment.toml").write_text(exp + '"test"\n')
    (tmp_path / "m.toml").write_text(
        MANIFEST.replace('path = "data/*/*.h5ad"', 'path = "data/*/s*.h5ad"')
    )
    (tmp_path / "data" / "replogle" / "other.h5ad").write_bytes(b"")  # in the dataset, not a source
    with caplog.at_level("WARNING"):
        build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    assert (
        "dataset 'replogle' also holds 1 file(s) the manifest does not list as sources"
        in caplog.text
    )
    assert {e.split for e in fmt.read_index(tmp_path / "out").shards} == {"train", "test"}
    (tmp_path / "experiment.toml").write_text(exp + '"val"\n')  # only the experiment file changes
    build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    assert {e.split for e in fmt.read_index(tmp_path / "out").shards} == {"train", "val"}
    assert verify(tmp_path / "out") == []
    build(
        tmp_path / "m.toml", tmp_path / "fresh", jobs=1, progress=False
    )  # incremental == from scratch
    assert [e.file for e in fmt.read_index(tmp_path / "out").shards] == [
        e.file for e in fmt.read_index(tmp_path / "fresh").shards
    ]
