"""A kind, a source and a sample type defined only in the tests (tests/plugin_toy.py) build, verify,
inspect and load end to end through the registries, for zarr and tar, with no change to library
code; a record kind rebuilds only what changed. A record kind with a csr field and a shard table:
tests/pipeline/test_kinds_csr.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loaders import ShardDataset, ShardLoader
from pipeline.build import build
from pipeline.cli import main as cli
from pipeline.errors import ManifestError
from pipeline.verify import summary, verify
from tests.plugin_toy import VOCAB, write_toy

MANIFEST = """
[dataset]
name = "toy"
kind = "toyvec"
format = "{fmt}"
seed = 3
shard_size_mb = 0.0003   # ~5 records per shard
plugins = ["tests.plugin_toy"]

[[sources]]
path = "src/*.toy"       # no type: inferred from the suffix among the sources of kind toyvec

[toy]
ragged = {ragged}
"""


def _records(seed: int, n: int, groups: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {
            "group": f"g{seed}-{i % groups}",
            "vec": rng.standard_normal(4).round(3).tolist(),
            "tokens": rng.integers(0, VOCAB, rng.integers(0, 6)).tolist(),
            "skip": bool(i == 5),
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module", params=["zarr", "tar"])
def toy(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp(f"toy-{request.param}")
    (root / "src").mkdir()
    recs = []
    for s in range(2):
        r = _records(s, 20, 4)
        write_toy(root / "src" / f"{s}.toy", r)
        recs += r
    (root / "m.toml").write_text(MANIFEST.format(fmt=request.param, ragged="true"))
    build(root / "m.toml", root / "out", jobs=2, progress=False)
    return root / "out", recs


def _expected(recs: list[dict]) -> dict[int, dict]:
    return {i: r for i, r in enumerate(recs) if not r["skip"]}


def test_build_verifies_and_counts_the_skipped(toy: tuple[Path, list[dict]]) -> None:
    out, recs = toy
    assert verify(out) == []
    index = json.loads((out / "index.json").read_text())
    assert index["kind"] == "toyvec" and index["samples"] == ["toyvec"] and index["tables"] == []
    assert index["stats"]["skipped"] == {
        "marked skip": 2
    }  # record 5 of each source: counted, not lost
    kept = sum(s["records"] for s in index["shards"])
    assert kept == len(recs) - 2 == index["primary_records"]
    assert len(index["shards"]) > 2
    s = summary(out)
    assert sum(v["units"]["toyvec"] for v in s["splits"].values()) == kept


def test_groups_never_cross_splits(toy: tuple[Path, list[dict]]) -> None:
    out, recs = toy
    split_of: dict[str, set[str]] = {}
    ds = {
        sp: ShardDataset(
            out, split=sp, sample="toyvec", batch_size=4, shuffle=False, decode_process=False
        )
        for sp in ("train", "test")
    }
    for sp, d in ds.items():
        for b in d:
            for i in b["sample_id"].tolist():
                split_of.setdefault(recs[i]["group"], set()).add(sp)
    assert split_of and all(len(v) == 1 for v in split_of.values())
    assert {next(iter(v)) for v in split_of.values()} == {"train", "test"}


@pytest.mark.process
@pytest.mark.parametrize("workers", [0, 2])
def test_loads_every_record_with_its_values(toy: tuple[Path, list[dict]], workers: int) -> None:
    out, recs = toy
    want = _expected(recs)
    got: dict[int, tuple] = {}
    for split in ("train", "test"):
        ds = ShardDataset(
            out,
            split=split,
            sample="toyvec",
            batch_size=3,
            shuffle=True,
            seed=1,
            decode_process=workers == 0,
        )  # main process: through the decoder child (imports the plug-in)
        for b in ShardLoader(ds, num_workers=workers):
            for i, sid in enumerate(b["sample_id"].tolist()):
                n = int(b["lengths"][i])
                got[sid] = (
                    b["vec"][i].numpy().tolist(),
                    b["tokens"][i, :n].tolist(),
                    b["tokens"][i, n:].tolist(),
                )
    assert sorted(got) == sorted(want)
    for sid, (vec, tokens, pad) in got.items():
        np.testing.assert_allclose(vec, want[sid]["vec"], rtol=1e-6)
        assert tokens == want[sid]["tokens"] and all(t == -1 for t in pad)


def test_inspect_cli(toy: tuple[Path, list[dict]], capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = toy
    assert cli(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "toyvec" in text and "marked skip=2" in text
    index = json.loads((out / "index.json").read_text())
    groups = ", ".join(f"{k}={v}" for k, v in index["stats"]["groups_per_split"].items())
    assert f"records scanned: 40; groups per split: {groups}" in text


def _tampered_index(out: Path, tmp_path: Path, edit) -> Path:  # noqa: ANN001
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    doc = json.loads((copy / "index.json").read_text())
    edit(doc)
    (copy / "index.json").write_text(json.dumps(doc))
    return copy


def test_verify_lists_a_declared_table_that_is_missing(
    toy: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    copy = _tampered_index(toy[0], tmp_path, lambda d: d["tables"].append("ghost"))
    problems = verify(copy)
    assert (
        problems
        and all("ghost" in p for p in problems)
        and len(problems) == len(json.loads((copy / "index.json").read_text())["shards"])
    )


def test_verify_finds_codes_outside_their_bound(
    toy: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    def shrink(d: dict) -> None:
        next(f for f in d["fields"] if f["name"] == "tokens")["bound"] = 2

    problems = verify(_tampered_index(toy[0], tmp_path, shrink))
    assert problems and any("outside [0, 2)" in p for p in problems)


def test_a_dataset_of_dense_fields_only(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    recs = _records(7, 12, 3)
    write_toy(tmp_path / "src" / "a.toy", recs)
    (tmp_path / "m.toml").write_text(MANIFEST.format(fmt="zarr", ragged="false"))
    build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    assert verify(tmp_path / "out") == []
    ids = []
    for split in ("train", "test"):
        for b in ShardDataset(
            tmp_path / "out", split=split, sample="toyvec", batch_size=5, decode_process=False
        ):
            assert set(b) == {"sample_id", "vec"}
            ids += b["sample_id"].tolist()
    assert sorted(ids) == sorted(_expected(recs))


def test_unknown_kind_and_missing_plugin_are_manifest_errors(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(
        MANIFEST.format(fmt="zarr", ragged="true").replace(
            'plugins = ["tests.plugin_toy"]', 'plugins = ["tests.no_such_plugin"]'
        )
    )
    with pytest.raises(ManifestError, match=r"dataset\.plugins.*no_such_plugin"):
        build(tmp_path / "m.toml", tmp_path / "out", progress=False)
    (tmp_path / "m.toml").write_text(
        MANIFEST.format(fmt="zarr", ragged="true").replace('kind = "toyvec"', 'kind = "toyvecs"')
    )
    with pytest.raises(ManifestError, match=r"dataset\.kind.*toyvecs"):
        build(tmp_path / "m.toml", tmp_path / "out", progress=False)


# -- incremental rebuilds of a record kind
# --------------------------------------------------------------------


def _toy_tree(root: Path, n_sources: int = 2) -> list[list[dict]]:
    (root / "src").mkdir(parents=True, exist_ok=True)
    out = []
    for s in range(n_sources):
        recs = _records(s, 20, 4)
        write_toy(root / "src" / f"{s}.toy", recs)
        out.append(recs)
    (root / "m.toml").write_text(MANIFEST.format(fmt="zarr", ragged="true"))
    return out


def test_record_kind_rebuilds_only_what_changed(tmp_path: Path) -> None:
    recs = _toy_tree(tmp_path)
    first = build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    files = {s["file"]: s["digest"] for s in first.index["shards"]}
    again = build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    assert again.written == [] and {s["file"]: s["digest"] for s in again.index["shards"]} == files
    # new values in source 1 (same records, same groups): only shards holding its records are
    # rewritten
    for r in recs[1]:
        r["vec"] = [v + 1 for v in r["vec"]]
    write_toy(tmp_path / "src" / "1.toy", recs[1])
    third = build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    src_of = {s["file"]: s["source"] for s in third.index["shards"]}
    assert third.written and third.reused
    assert all(src_of[f] in (1, -1) for f in third.written)  # -1: a shard mixing sources
    assert all(src_of[f] in (0, -1) and f in files for f in third.reused)
    assert set(files) - {s["file"] for s in third.index["shards"]} <= set(files) - set(third.reused)
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["stats"]["skipped"] == {
        "marked skip": 2
    }  # a reused shard's skips are still counted
    assert verify(tmp_path / "out") == []
    assert not list((tmp_path / "out" / "shards").glob(".tmp-*"))


def test_record_shards_are_keyed_by_the_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record's values come from read_record at pack time: other code must not reuse the old
    shards."""
    import pipeline.build
    import pipeline.incremental

    _toy_tree(tmp_path)
    first = build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    for module in (pipeline.build, pipeline.incremental):
        monkeypatch.setattr(module, "code_digest", lambda: "other code")
    again = build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    assert again.reused == [] and len(again.written) == len(first.index["shards"])
    assert not set(again.written) & {s["file"] for s in first.index["shards"]}


@pytest.mark.process
def test_jobs_do_not_change_record_shards(tmp_path: Path) -> None:
    _toy_tree(tmp_path)
    (tmp_path / "m.toml").write_text(MANIFEST.format(fmt="tar", ragged="true"))
    a = build(tmp_path / "m.toml", tmp_path / "a", jobs=1, progress=False)
    b = build(tmp_path / "m.toml", tmp_path / "b", jobs=2, backend="loky", progress=False)
    assert [(s["file"], s["digest"]) for s in a.index["shards"]] == [
        (s["file"], s["digest"]) for s in b.index["shards"]
    ]


def test_a_shard_whose_records_are_all_skipped_is_counted_and_verifies(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    recs = [{**r, "skip": r["group"].endswith("-0")} for r in _records(5, 12, 3)]
    write_toy(tmp_path / "src" / "a.toy", recs)
    (tmp_path / "m.toml").write_text(MANIFEST.format(fmt="zarr", ragged="true"))
    build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["stats"]["skipped"] == {"marked skip": 4}
    assert sum(s["records"] for s in index["shards"]) == 8 == index["primary_records"]
    assert min(s["records"] for s in index["shards"]) == 0  # group g5-0 filled a shard on its own
    assert verify(tmp_path / "out") == []
    ids = [
        i
        for split in ("train", "test")
        for b in ShardDataset(
            tmp_path / "out", split=split, sample="toyvec", batch_size=3, decode_process=False
        )
        for i in b["sample_id"].tolist()
    ]
    assert sorted(ids) == [i for i, r in enumerate(recs) if not r["skip"]]
