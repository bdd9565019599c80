"""Nightly operation: --dry-run changes nothing and predicts the build; --log-json writes one JSON
object per event; exit codes and the last stdout line (a JSON summary) tell a scheduler what
happened; added, removed and changed sources rebuild only their own shards."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pipeline.build
from pipeline.build import build
from pipeline.cli import main
from pipeline.modalities.perturbation.demo import write_perturb_h5ad

N_GENES = 60


def _source(path: Path, seed: int, density: float = 0.1) -> Path:
    """Same seed, same cells and labels; another density, other values (so the labels' tables stay
    put)."""
    return write_perturb_h5ad(
        path, n_cells=240, n_genes=N_GENES, n_perts=5, seed=seed, density=density
    )


@pytest.fixture
def screens(tmp_path: Path, write_manifest: Callable[..., Any]) -> tuple[Path, list[Path], Path]:
    """Three sources (the third has the first's labels, so it can go without changing any
    vocabulary), built."""
    src = tmp_path / "src"
    paths = [
        _source(src / "screen_0.h5ad", 0),
        _source(src / "screen_1.h5ad", 1),
        _source(src / "screen_2.h5ad", 0, 0.2),
    ]
    manifest = write_manifest(tmp_path / "m.toml")
    build(manifest, tmp_path / "out", jobs=1, progress=False)
    return manifest, paths, tmp_path / "out"


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and folder under root (hidden ones too): path -> (sha256 of its bytes, mtime_ns)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.stat()
        out[str(p.relative_to(root))] = (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir",
            st.st_mtime_ns,
        )
    return out


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, dict[str, object]]:
    code = main(["build", *args, "--jobs", "1", "-q", "--json"])
    cap = capsys.readouterr()  # --json: stdout is the summary's one line, the rest on stderr
    assert len(cap.out.strip().splitlines()) == 1, cap.out
    return code, cap.err + cap.out, json.loads(cap.out)


def test_dry_run_changes_nothing_and_predicts_the_build(
    screens: tuple[Path, list[Path], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest, paths, out = screens
    _source(
        paths[1], 1, 0.4
    )  # a first change: generation 2 keeps generation 1's shards for its readers
    build(manifest, out, jobs=1, progress=False)
    _source(paths[1], 1, 0.3)  # changed: generation 3 retires generation 1's shards of source 1
    _source(
        tmp_path / "src" / "screen_3.h5ad", 1, 0.25
    )  # added (sorts last: the others keep their offsets)
    before = tree(tmp_path)
    code, text, summary = _cli([str(manifest), "--out", str(out), "--dry-run"], capsys)
    assert code == 0 and tree(tmp_path) == before, "the dry run changed the tree"
    assert summary["status"] == "dry-run" and summary["changed"] is True
    diff = pipeline.build.build(manifest, out, jobs=1, progress=False, dry_run=True).difference
    assert diff is not None and tree(tmp_path) == before
    res = build(manifest, out, jobs=1, progress=False)
    assert sorted(diff.write) == sorted(res.written) and sorted(diff.reuse) == sorted(res.reused)
    assert len(diff.delete) == res.removed > 0
    assert sorted(f"shards/{f}" for f in diff.delete) == [
        f for f in res.index["retired"] if f.startswith("shards/")
    ]
    assert summary["write"] == len(res.written) and summary["delete"] == res.removed
    assert all(f"+ {f}" in text for f in res.written)
    # and once built, the dry run has nothing to do
    code, _, summary = _cli([str(manifest), "--out", str(out), "--dry-run"], capsys)
    assert code == 0 and summary["changed"] is False and summary["write"] == summary["delete"] == 0


def test_exit_codes_and_the_summary_line(
    screens: tuple[Path, list[Path], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    write_manifest: Callable[..., Any],
) -> None:
    manifest, paths, out = screens
    code, _, summary = _cli([str(manifest), "--out", str(out)], capsys)
    assert (code, summary["changed"], summary["written"], summary["status"]) == (0, False, 0, "ok")
    _source(paths[0], 0, 0.3)
    code, _, summary = _cli([str(manifest), "--out", str(out)], capsys)
    assert (code, summary["changed"], summary["status"]) == (0, True, "ok") and summary[
        "written"
    ] > 0
    assert summary["bytes_written"] > 0
    bad = write_manifest(tmp_path / "bad.toml", pattern="nowhere/*.h5ad")
    code, _, summary = _cli([str(bad), "--out", str(tmp_path / "x")], capsys)
    assert (code, summary["exit_code"], summary["status"], summary["changed"]) == (
        2,
        2,
        "failed",
        False,
    )

    from pipeline.lock import exclusive

    _source(paths[1], 1, 0.3)
    with exclusive(out):  # another build holds --out
        code, _, summary = _cli([str(manifest), "--out", str(out)], capsys)
    assert (code, summary["exit_code"], summary["status"], summary["changed"]) == (
        3,
        3,
        "failed",
        False,
    )

    def crash(*a: object, **k: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(pipeline.build, "write_conditions", crash)
    _source(paths[0], 0, 0.1)
    with pytest.raises(RuntimeError, match="a bug"):
        main(
            ["build", str(manifest), "--out", str(out), "--jobs", "1", "-q", "--json"]
        )  # python -m exits 1 on it
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["exit_code"], summary["status"]) == (1, "failed")


def test_log_json_writes_one_object_per_event(
    screens: tuple[Path, list[Path], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest, paths, out = screens
    _source(paths[2], 0, 0.3)
    log = tmp_path / "build.jsonl"
    code, _, summary = _cli([str(manifest), "--out", str(out), "--log-json", str(log)], capsys)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    names = [e["event"] for e in events]
    assert code == 0 and names[0] == "start" and names[-1] == "summary" and events[-1] == summary
    assert {"scanned", "planned", "shard", "committed"} <= set(names)
    written = [e["file"] for e in events if e["event"] == "shard"]
    assert sorted(written) == sorted(f for f in summary_files(out) if "-002-" in f)
    assert all(isinstance(e["t"], float) for e in events)


def summary_files(out: Path) -> list[str]:
    return [s["file"] for s in json.loads((out / "index.json").read_text())["shards"]]


def test_an_added_source_writes_only_its_shards(
    screens: tuple[Path, list[Path], Path], tmp_path: Path, shard_files: Callable[..., Any]
) -> None:
    manifest, _, out = screens
    before = shard_files(out)
    _source(tmp_path / "src" / "screen_3.h5ad", 1, 0.25)
    res = build(manifest, out, jobs=1, progress=False)
    src_of = {s["file"]: s["source"] for s in res.index["shards"]}
    assert res.written and {src_of[f] for f in res.written} == {3} and res.removed == 0
    after = shard_files(out)
    assert all(after[k] == v for k, v in before.items()), "an old shard was rewritten"


def test_a_removed_source_deletes_only_its_shards(
    screens: tuple[Path, list[Path], Path], shard_files: Callable[..., Any]
) -> None:
    """Its shards stay one generation (a loader that opened the dataset may still read them), then
    go."""
    manifest, paths, out = screens
    before = shard_files(out)
    gone = {f.split("/")[1] for f in before if "-002-" in f}
    paths[2].unlink()
    res = build(manifest, out, jobs=1, progress=False)
    assert res.written == [] and res.removed == 0 and res.changed and shard_files(out) == before
    _source(paths[1], 1, 0.3)  # the next commit retires them
    res = build(manifest, out, jobs=1, progress=False)
    assert res.removed == len(gone) > 0 and {f"shards/{f}" for f in gone} == set(
        res.index["retired"]
    )
    after = shard_files(out)
    assert after == {k: v for k, v in before.items() if k.split("/")[1] not in gone} | {
        k: v for k, v in after.items() if "-001-" in k
    }


def test_a_changed_source_rewrites_only_its_shards(
    screens: tuple[Path, list[Path], Path], shard_files: Callable[..., Any]
) -> None:
    manifest, paths, out = screens
    before = shard_files(out)
    _source(paths[1], 1, 0.3)
    res = build(manifest, out, jobs=1, progress=False)
    src_of = {s["file"]: s["source"] for s in res.index["shards"]}
    assert res.written and {src_of[f] for f in res.written} == {1}
    after = shard_files(out)
    assert all(after[k] == v for k, v in before.items() if "-001-" not in k)
