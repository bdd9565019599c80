"""Files laid out like real scPerturb releases, built with the shipped example manifests: standard
obs keys (perturbation, celltype, nperts, perturbation_type, dose_value, time; no batch column),
combinations written "A_B", numeric doses and times, GEARS' unseen-combination split and
cell-load's zero-shot controls."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from loaders import format as fmt
from pipeline.build import build
from pipeline.errors import ManifestError
from pipeline.verify import summary, verify

REPO = Path(__file__).resolve().parents[3]
SINGLES = ["AHR", "CEBPA", "FOXA1", "KLF1", "SET"]
DOUBLES = [
    "AHR_KLF1",
    "CEBPA_FOXA1",
    "AHR_SET",
    "KLF1_SET",
    "AHR_CEBPA",
    "CEBPA_KLF1",
    "FOXA1_SET",
    "AHR_FOXA1",
    "FOXA1_ZNF318",
]  # ZNF318 is never alone
DRUGS = ["Dex", "SAHA", "Nutlin"]


def write_scperturb(path: Path, kind: str, n: int = 900, seed: int = 0) -> Path:
    """An h5ad with scPerturb's standard obs keys and integer counts in X (no gemgroup/batch
    column)."""
    rng = np.random.default_rng(seed)
    if kind == "norman":
        labels = np.asarray(["control"] + SINGLES + DOUBLES, dtype=object)[
            rng.integers(0, 1 + len(SINGLES) + len(DOUBLES), n)
        ]
        labels[:60] = "control"
        obs = {
            "perturbation": labels,
            "celltype": np.full(n, "K562", object),
            "nperts": np.array([0 if x == "control" else x.count("_") + 1 for x in labels]),
            "perturbation_type": np.full(n, "CRISPR", object),
            "dose_value": np.full(n, np.nan),
            "organism": np.full(n, "human", object),
        }
    else:
        drug = np.asarray(["control"] + DRUGS, dtype=object)[rng.integers(0, 4, n)]
        dose = np.where(
            drug == "control", 0.0, np.asarray([10.0, 100.0, 1000.0])[rng.integers(0, 3, n)]
        )
        obs = {
            "perturbation": drug,
            "celltype": np.asarray(["A549", "K562", "MCF7"], object)[rng.integers(0, 3, n)],
            "dose_value": dose,
            "dose_unit": np.full(n, "nM", object),
            "time": np.asarray([24.0, 72.0])[rng.integers(0, 2, n)],
            "nperts": (drug != "control").astype(int),
            "perturbation_type": np.full(n, "drug", object),
        }
    frame = pd.DataFrame(obs, index=[f"cell{i}" for i in range(n)])
    for c in ("perturbation", "celltype", "perturbation_type"):
        frame[c] = frame[c].astype("category")
    x = sp.random(n, 40, density=0.2, format="csr", random_state=seed, dtype=np.float32)
    x.data = np.ceil(x.data * 10)
    adata = ad.AnnData(X=x, obs=frame, var=pd.DataFrame(index=[f"ENSG{i:05d}" for i in range(40)]))
    path.parent.mkdir(parents=True, exist_ok=True)
    adata.write_h5ad(path)
    return path


def example(tmp: Path, name: str, source: Path, edit: dict[str, str] | None = None) -> Path:
    """The shipped example manifest, pointed at `source` (and with `edit`ed lines: key -> new line)."""
    text = (REPO / "data_manifests" / "examples" / name).read_text()
    text = re.sub(r'(?m)^path = ".*"', f'path = "{source}"', text)
    text = text.replace("shard_size_mb = 64", "shard_size_mb = 0.02")
    for key, line in (edit or {}).items():
        text = re.sub(rf"(?m)^{key} = .*$", line, text)
    out = tmp / name
    out.write_text(text)
    return out


def vectors(out: Path, index: fmt.Index) -> np.ndarray:
    import zarr

    assert index.conditions is not None
    return zarr.open_group(str(out / index.conditions.file), mode="r")[fmt.CONDITION_VECTORS][...]


def cells_by_split(index: fmt.Index, shards: list) -> dict[str, dict[str, np.ndarray]]:
    """Primary cells per split: sample ids and decoded labels."""
    out: dict[str, dict[str, list]] = {}
    for entry, cols in shards:
        keep = cols[fmt.PRIMARY]
        d = out.setdefault(entry.split, {})
        d.setdefault("id", []).append(cols[fmt.SAMPLE_ID][keep])
        for f in index.obs_fields:
            d.setdefault(f, []).append(
                np.asarray(index.vocabularies[f])[cols[fmt.OBS_PREFIX + f][keep]]
            )
    return {s: {k: np.concatenate(v) for k, v in d.items()} for s, d in out.items()}


def test_norman_release_combinations_and_gears_split(
    tmp_path: Path, read_all: Callable[..., Any]
) -> None:
    src = write_scperturb(tmp_path / "data" / "NormanWeissman2019_filtered.h5ad", "norman")
    out = tmp_path / "out"
    build(example(tmp_path, "scperturb_norman2019.toml", src), out, jobs=1, progress=False)
    assert verify(out) == []
    index, shards = read_all(out)
    assert index.obs_fields == ["perturbation", "cell_type"] and "batch" not in index.vocabularies
    seg = index.conditions.segments[0]
    assert seg["encoding"] == "combination" and seg["parts"] == sorted([*SINGLES, "ZNF318"])
    vec = vectors(out, index)[:, : seg["size"]]
    parts = seg["parts"]
    for _, cols in shards:
        labels = np.asarray(index.vocabularies["perturbation"])[cols["obs/perturbation"]]
        for label, v in zip(labels, vec[cols[fmt.COND_ID]], strict=True):
            want = np.zeros(len(parts), np.float32)
            for p in [] if label == "control" else label.split("_"):
                want[parts.index(p)] += 1
            np.testing.assert_array_equal(v, want)  # "A_B" = A + B, control = zeros
    by = cells_by_split(index, shards)
    held = {
        lab
        for s in ("val", "test")
        for lab in by.get(s, {}).get("perturbation", [])
        if lab != "control"
    }
    train = set(by["train"]["perturbation"])
    assert held, "some combinations are held out"
    assert (
        set(SINGLES) <= train and "FOXA1_ZNF318" in train
    )  # singles and unseen-gene combos stay in train
    for lab in held:  # every held-out label: a combination of genes seen alone in train
        assert "_" in lab and all(g in train for g in lab.split("_")), lab
        assert lab not in train, "a combination goes to one split whole"


def test_sciplex_release_numeric_doses_and_cellload_zeroshot(
    tmp_path: Path, read_all: Callable[..., Any]
) -> None:
    src = write_scperturb(tmp_path / "data" / "SrivatsanTrapnell2020_sciplex3.h5ad", "sciplex")
    out = tmp_path / "out"
    build(example(tmp_path, "scperturb_sciplex.toml", src), out, jobs=1, progress=False)
    assert verify(out) == []
    index, shards = read_all(out)
    segs = {s["field"]: s for s in index.conditions.segments}
    assert segs["dose_value"]["encoding"] == "numeric" and segs["dose_value"]["size"] == 1
    assert segs["time"]["transform"] == "log1p"
    vec = vectors(out, index)
    obs = ad.read_h5ad(src).obs
    for _, cols in shards:
        v = vec[cols[fmt.COND_ID]]
        ids = cols[fmt.SAMPLE_ID]
        np.testing.assert_allclose(
            v[:, segs["dose_value"]["offset"]],
            np.log1p(obs["dose_value"].to_numpy()[ids]),
            rtol=1e-6,
        )
        np.testing.assert_allclose(
            v[:, segs["time"]["offset"]], np.log1p(obs["time"].to_numpy()[ids]), rtol=1e-6
        )
    by = cells_by_split(index, shards)
    is_mcf7_ctrl = (by["train"]["cell_type"] == "MCF7") & (by["train"]["perturbation"] == "control")
    n_ctrl = int(((obs["celltype"] == "MCF7") & (obs["perturbation"] == "control")).sum())
    assert is_mcf7_ctrl.sum() == n_ctrl, "controls = train: every MCF7 control cell is in train"
    assert set(by["test"]["cell_type"]) == {"MCF7"} and "control" not in set(
        by["test"]["perturbation"]
    )
    assert (by["train"]["cell_type"][by["train"]["perturbation"] != "control"] != "MCF7").all()
    train_ids = set(by["train"]["id"].tolist())
    for entry, cols in shards:
        if entry.split != "test":
            continue
        pairs = cols[fmt.PAIRS]
        ct = np.asarray(index.vocabularies["cell_type"])[cols["obs/cell_type"]]
        assert (ct[pairs[:, 0]] == "MCF7").all(), (
            "held-out cells pair with their own cell type's controls"
        )
        assert not cols[fmt.PRIMARY][pairs[:, 0]].any()  # ... stored as copies of train's cells
        assert set(cols[fmt.SAMPLE_ID][pairs[:, 0]].tolist()) <= train_ids
    assert summary(out)["details"]["pairing"]["pairs_exact"] > 0


def test_batch_and_cell_type_are_optional(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = write_scperturb(tmp_path / "data" / "n.h5ad", "norman", n=300)
    for line in ('cell_type = ""', "# no cell type"):
        out = tmp_path / f"out{len(line)}"
        manifest = example(
            tmp_path,
            "scperturb_norman2019.toml",
            src,
            {"cell_type": line, "mode": 'mode = "random"', "combinations": ""},
        )
        caplog.clear()
        build(manifest, out, jobs=1, progress=False)
        assert (
            "[fields] cell_type is not set, so the build ignores obs column 'celltype'"
            in caplog.text
        )
        index = fmt.read_index(out)
        assert index.obs_fields == ["perturbation"] and set(index.vocabularies) == {"perturbation"}
        assert verify(out) == []
        assert summary(out)["details"]["pairing"]["pairs_exact"] > 0
    from loaders import ShardDataset

    for sample in ("cells", "pairs", "sentences"):  # the loader needs neither field either
        ds = ShardDataset(
            out, split="train", sample=sample, batch_size=4, shuffle=False, decode_process=False
        )
        assert next(iter(ds))["cond"].shape[0] == 4


def test_combination_features_are_summed_per_part(
    tmp_path: Path, read_all: Callable[..., Any]
) -> None:
    src = write_scperturb(tmp_path / "data" / "n.h5ad", "norman", n=300)
    singles = sorted([*SINGLES, "ZNF318"])
    feats = {
        g: np.full(2, i + 1, np.float32) for i, g in enumerate(singles)
    }  # keyed by single perturbations
    np.savez(tmp_path / "feats.npz", **feats)
    manifest = example(
        tmp_path,
        "scperturb_norman2019.toml",
        src,
        {"values": 'values = "counts"\nperturbation_features = "feats.npz"'},
    )
    build(manifest, tmp_path / "out", jobs=1, progress=False)
    index, shards = read_all(tmp_path / "out")
    seg = index.conditions.segments[0]
    assert (
        seg["encoding"] == "combination"
        and seg["encoding_of_parts"] == "features"
        and seg["size"] == 2
    )
    vec = vectors(tmp_path / "out", index)
    for _, cols in shards:
        labels = np.asarray(index.vocabularies["perturbation"])[cols["obs/perturbation"]]
        for label, v in zip(labels, vec[cols[fmt.COND_ID], :2], strict=True):
            want = (
                sum((feats[g] for g in label.split("_")), np.zeros(2, np.float32))
                if label != "control"
                else 0
            )
            np.testing.assert_array_equal(v, want)


def test_numeric_covariate_errors_name_the_key_and_fix(tmp_path: Path) -> None:
    src = write_scperturb(tmp_path / "data" / "n.h5ad", "norman", n=200)
    manifest = example(
        tmp_path,
        "scperturb_norman2019.toml",
        src,
        {
            "combinations": "",
            "mode": 'mode = "random"',
            "values": 'values = "counts"\nnumeric_covariates = ["perturbation_type"]',
        },
    )
    with pytest.raises(
        ManifestError, match=r"fields\.numeric_covariates.*'perturbation_type'.*fields\.covariates"
    ):
        build(manifest, tmp_path / "out", jobs=1, progress=False)
    assert not (tmp_path / "out" / fmt.INDEX_FILE).exists()
    manifest = example(tmp_path, "scperturb_norman2019.toml", src, {"mode": 'mode = "zeroshot"'})
    with pytest.raises(ManifestError, match=r"split\.combinations.*mode = \"fewshot\""):
        build(manifest, tmp_path / "out", jobs=1, progress=False)
