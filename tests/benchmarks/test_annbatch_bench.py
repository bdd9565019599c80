"""The optional annbatch baseline (benchmarks/annbatch_bench.py, annbatch_worker.py): finding a
Python >= 3.12, the skip record when there is none, the worker script loading under our
interpreter without annbatch, the shared timing loop, and BENCHMARKS.md rendering both the skip
note and a measured row. The measured path itself needs a 3.12 interpreter and an index to
install from; these tests run without either."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import annbatch_bench as ab
from benchmarks import annbatch_worker as worker
from benchmarks.report import markdown

pytestmark = pytest.mark.bench  # the benchmark harness (benchmarks/)

REPO = Path(__file__).resolve().parents[2]
SKIP_LINE = (
    "annbatch: skipped — needs Python >= 3.12, none found; "
    "set SHARDSMITH_ANNBATCH_PYTHON=/path/to/python3.12"
)


def fake_python(path: Path, version: str) -> str:
    """An executable that answers the version probe like a Python of ``version`` ("3 11 9") and
    fails anything else (a pip install, a venv)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo {version}; exit 0; fi\nexit 3\n')
    path.chmod(0o755)
    return str(path)


def no_which(_name: str) -> None:
    return None


def test_env_var_is_honoured(tmp_path: Path) -> None:
    exe = fake_python(tmp_path / "py", "3 12 1")
    got = ab.find_python({ab.ENV_VAR: exe, "PYENV_ROOT": str(tmp_path / "none")}, no_which)
    assert got == ab.Interpreter(exe, (3, 12, 1)) and got.tag == "3.12"


def test_env_var_with_python_311_is_rejected_not_replaced(tmp_path: Path) -> None:
    old = fake_python(tmp_path / "py311", "3 11 9")
    new = fake_python(tmp_path / "py313", "3 13 0")
    got = ab.find_python({ab.ENV_VAR: old}, lambda n: new if n == "python3.13" else None)
    assert isinstance(got, str) and "3.11.9" in got and ">= 3.12" in got and old in got
    broken = ab.find_python({ab.ENV_VAR: str(tmp_path / "missing")}, no_which)
    assert isinstance(broken, str) and "does not run" in broken


def test_path_and_pyenv_candidates(tmp_path: Path) -> None:
    old = fake_python(
        tmp_path / "bin" / "python3.12", "3 11 9"
    )  # a name that lies: the probe decides
    root = tmp_path / "pyenv"
    fake_python(root / "versions" / "3.11.9" / "bin" / "python", "3 11 9")
    assert ab.find_python({"PYENV_ROOT": str(root)}, lambda n: old) == ab.NO_PYTHON
    good = fake_python(root / "versions" / "3.12.4" / "bin" / "python", "3 12 4")
    fake_python(
        root / "versions" / "3.12.4-debug" / "bin" / "python", "3 12 4"
    )  # not a plain version: ignored
    assert ab.find_python({"PYENV_ROOT": str(root)}, lambda n: old) == ab.Interpreter(
        good, (3, 12, 4)
    )
    on_path = fake_python(tmp_path / "bin" / "python3.13", "3 13 2")
    got = ab.find_python(
        {"PYENV_ROOT": str(root)}, lambda n: on_path if n == "python3.13" else None
    )
    assert got == ab.Interpreter(on_path, (3, 13, 2))  # PATH before pyenv


def test_none_found_gives_the_skip_record(tmp_path: Path) -> None:
    env = {"PYENV_ROOT": str(tmp_path / "no-pyenv")}
    rec = ab.run_annbatch(
        "x.h5ad", "shards", tmp_path / "data", tmp_path / "work", env=env, which=no_which
    )
    assert rec == {"status": "skipped", "reason": ab.NO_PYTHON}
    assert ab.summary_line(rec) == SKIP_LINE
    assert not (tmp_path / "data").exists()  # nothing installed or converted


def test_venv_is_reused_only_with_the_same_packages(tmp_path: Path) -> None:
    py = ab.Interpreter(fake_python(tmp_path / "py", "3 12 0"), (3, 12, 0))
    venv = tmp_path / "ab" / "venv-py3.12"
    vpy = fake_python(venv / "bin" / "python", "3 12 0")
    (venv / ".shardsmith-installed").write_text(f"{ab.ANNBATCH_SPEC} torch==2.13.0")
    assert ab.ensure_venv(py, tmp_path / "ab", "torch==2.13.0") == vpy
    # another torch pin: a reinstall, which the fake interpreter cannot do -> Unavailable with the
    # log named
    with pytest.raises(ab.Unavailable, match="exit 3.*install.log"):
        ab.ensure_venv(py, tmp_path / "ab", "torch==9.9")
    assert (
        (venv / ".shardsmith-installed").read_text().endswith("torch==2.13.0")
    )  # stamp only after success


@pytest.mark.process
def test_worker_loads_without_annbatch_and_reports_its_absence(tmp_path: Path) -> None:
    src = Path(worker.__file__).read_text()
    ast.parse(src, feature_version=(3, 10))  # our lowest supported Python parses it too
    probe = (
        "import sys, benchmarks.annbatch_worker as w; "
        "print(sorted(m for m in ('annbatch', 'numpy', 'torch', 'loaders') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout  # stdlib only at import time
    spec, res = tmp_path / "spec.json", tmp_path / "out.json"
    spec.write_text(
        json.dumps(
            {"collection": "c.zarr", "batch_size": 4, "warmup": 0, "seconds": 0.1, "windows": 1}
        )
    )
    for task, msg in (("version", "annbatch"), ("annbatch", "annbatch"), ("nope", "unknown task")):
        rc = subprocess.run(
            [sys.executable, "-I", str(worker.__file__), task, str(spec), str(res)],
            capture_output=True,
        ).returncode
        doc = json.loads(res.read_text())
        assert rc == 1 and msg in doc["error"], (task, doc)


class Row:
    def __init__(self, n: int) -> None:
        self.shape = (n, 3)


class Batches:
    def __init__(self, rows: int) -> None:
        self.rows, self.served = rows, 0

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> dict[str, Any]:
        self.served += 1
        return {"X": Row(self.rows)}


def test_timed_streams_protocol() -> None:
    ticks = iter(range(10_000))
    clock = lambda: float(next(ticks))  # noqa: E731 - every clock read advances 1 s
    a, b = Batches(2), Batches(5)
    res = worker.timed_streams(
        {"a": lambda: a, "b": lambda: b}, warmup=3, seconds=2.5, windows=3, clock=clock
    )
    assert res["a"]["ttfb_s"] == 1.0 and res["b"]["ttfb_s"] == 1.0
    # a window reads the clock once per batch: 3 batches in 3 s
    assert res["a"]["windows"] == [2.0] * 3 and res["b"]["windows"] == [5.0] * 3
    assert res["a"]["cells_per_s"] == 2.0 and a.served == 1 + 3 + 9
    assert worker.rows_of({"X": Row(7)}) == 7 and worker.rows_of(Row(3)) == 3


def test_endless_chains_epochs_and_stops_on_empty_ones() -> None:
    seen: list[int] = []

    def epoch(e: int) -> Any:
        seen.append(e)
        return iter([e, e])

    it = worker.Endless(epoch)
    assert [next(it) for _ in range(5)] == [0, 0, 1, 1, 2] and seen == [0, 1, 2]
    with pytest.raises(RuntimeError, match="no batch"):
        next(worker.Endless(lambda e: iter(())))


def stream(cps: float) -> dict[str, Any]:
    return {"cells_per_s": cps, "ttfb_s": 0.5, "windows": [cps]}


def measured() -> dict[str, Any]:
    ours = [
        {"streams": {"default": stream(o), "sparse": stream(2 * o)}} for o in (100.0, 300.0, 200.0)
    ]
    theirs = [
        {"streams": {"default": stream(t), "sparse": stream(t)}} for t in (25.0, 100.0, 400.0)
    ]
    return {
        "status": "measured",
        "python": "/x/python3.12 (3.12.4)",
        "annbatch": "0.3.1",
        "zarrs": True,
        "preload_to_gpu": False,
        "settings": {"chunk_size": 512, "preload_nchunks": 32},
        "convert_s": 12.0,
        "convert_cached": False,
        "rounds": 3,
        "windows": 2,
        "seconds": 2.0,
        "warmup": 5,
        "batch_size": 256,
        "rows": ab.pair_rows(ours, theirs),
    }


def test_pair_rows_take_the_median_of_per_pair_ratios() -> None:
    rows = {r["stream"]: r for r in measured()["rows"]}
    assert (
        rows["default"]["ratios"] == [4.0, 3.0, 0.5] and rows["default"]["ratio"] == 3.0
    )  # not 200 / 100
    assert rows["default"]["cells_per_s"] == 100.0 and rows["default"]["ours_cells_per_s"] == 200.0
    assert rows["sparse"]["ratio"] == 6.0  # [8, 6, 1]


def minimal_results(annbatch: dict[str, Any] | None) -> dict[str, Any]:
    """The least a results document needs for report.markdown (sections not measured)."""
    cfg = {
        "mode": "quick",
        "sentence_size": 8,
        "shard_size_mb": 1,
        "batch_size": 256,
        "sentence_batch": 16,
        "warmup": 5,
        "seconds": 2.0,
        "repeats": 3,
    }
    ds = {
        "n_cells": 1000,
        "n_genes": 50,
        "nnz_fraction": 0.1,
        "n_perturbations": 5,
        "control_fraction": 0.1,
        "n_cell_types": 2,
        "n_batches": 2,
        "n_timepoints": 2,
        "file_bytes": 1e6,
        "generate_s": 0.0,
    }
    machine = {
        "cpu_model": "cpu",
        "cpu_count_logical": 2,
        "cpu_affinity": 2,
        "ram_gib": 8,
        "platform": "linux",
        "python": "3.11",
    }
    res: dict[str, Any] = {
        "machine": machine,
        "config": cfg,
        "datasets": {"main": ds},
        "date": "today",
        "total_s": 1.0,
        "packages": {},
        "targets": [],
        "loader": {"results": []},
        "pipeline": {"skipped": "x"},
        "gpu": {"status": "not measured"},
        "spike": {"skipped": "x"},
        "ct": {"skipped": "x"},
    }
    if annbatch is not None:
        res["annbatch"] = annbatch
    return res


def test_report_prints_the_skip_note_and_a_measured_row() -> None:
    md = markdown(minimal_results({"status": "skipped", "reason": ab.NO_PYTHON}), {})
    loader = md.split("## Loader")[1].split("## Pipeline")[0]
    assert "### annbatch" in loader and SKIP_LINE in loader.splitlines()
    md = markdown(minimal_results(measured()), {})
    loader = md.split("## Loader")[1].split("## Pipeline")[0]
    assert (
        "annbatch 0.3.1" in loader
        and "process level" in loader
        and "zarrs codec pipeline on" in loader
    )
    row = next(line for line in loader.splitlines() if line.startswith("| annbatch default"))
    assert (
        "| 100 |" in row and "| 200 |" in row and "| 3.00x |" in row and "4.00, 3.00, 0.50" in row
    )
    failed = markdown(
        minimal_results({"status": "failed", "reason": "pip install annbatch failed"}), {}
    )
    assert "annbatch: failed — pip install annbatch failed" in failed
    assert "### annbatch" not in markdown(minimal_results(None), {})


def test_build_rows_take_the_median_ratio_and_the_scale_json(tmp_path: Path) -> None:
    """26.3a is annbatch seconds / ours, median of the per-round ratios; 26.3b is the largest
    size of the last bench-scale; either is 'not measured' with its reason when absent."""
    from benchmarks.build_vs_annbatch import build_annbatch_section
    from benchmarks.targets_extra import build_targets

    scale = tmp_path / "scale.json"
    scale.write_text(
        '{"date": "d", "sizes": [{"n_cells": 2, "vs_limit_cpu": 0.9, "limit_cpu_s": 1.0,'
        ' "build": {"cpu_s": 2.0}}, {"n_cells": 20, "vs_limit_cpu": 0.25, "limit_cpu_s": 5.0,'
        ' "build": {"cpu_s": 20.0}, "floor_cpu_s": 4.0, "vs_floor_cpu": 0.2}]}'
    )
    rec = {"ratio": 2.6, "ours_s": [1.0, 2.0], "annbatch_s": [2.6, 5.2], "jobs": 2}
    a, b = build_targets({"build_annbatch": rec}, scale)
    assert (a["name"], a["value"], a["status"]) == ("26.3a", 2.6, "met")
    assert (b["name"], b["value"], b["status"]) == ("26.3b", 0.25, "missed")
    assert "against the floor (the limit's work in reused memory, 4.0 s) 0.20x" in b["detail"]
    a, b = build_targets({"build_annbatch": {"skipped": "no Python"}}, tmp_path / "none.json")
    assert a["value"] is None and "no Python" in a["detail"]
    assert b["value"] is None and "bench-scale" in b["detail"]
    cfg = type("Cfg", (), {"mode": "quick"})()
    assert (
        "smoke" in build_annbatch_section(cfg, tmp_path, tmp_path, tmp_path, set(), "t")["skipped"]
    )


def test_build_vs_annbatch_alternates_and_divides_theirs_by_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import benchmarks.build_vs_annbatch as bva
    from benchmarks.annbatch_bench import Interpreter

    calls: list[str] = []
    ours = iter([(1.0, 0.4), (2.0, 0.5), (4.0, 0.3)])
    theirs = iter([3.0, 2.0, 10.0])
    monkeypatch.setattr(bva, "find_python", lambda: Interpreter("py", (3, 12, 0)))
    monkeypatch.setattr(bva, "ensure_venv", lambda *a: "vpy")
    monkeypatch.setattr(bva, "ours_once", lambda *a: calls.append("ours") or next(ours))
    monkeypatch.setattr(
        bva,
        "run_worker",
        lambda *a, **k: calls.append("annbatch") or {"convert_s": next(theirs)},
    )
    rec = bva.measure(tmp_path / "m.toml", tmp_path / "x.h5ad", tmp_path, 3)
    assert calls == ["ours", "annbatch"] * 3
    assert rec["ratios"] == [3.0, 1.0, 2.5] and rec["ratio"] == 2.5
    assert rec["ours_s"] == [1.0, 2.0, 4.0] and rec["ours_imports_s"] == [0.4, 0.5, 0.3]


@pytest.mark.process
def test_our_build_child_imports_before_it_runs_the_cli() -> None:
    """The child of 26.3a imports `PRELOAD` first and says how long it took, then runs the
    CLI with the rest of its arguments (here `--help`: exit 0, the CLI's usage)."""
    import benchmarks.build_vs_annbatch as bva

    repo = Path(bva.__file__).resolve().parents[1]
    preload = "json,zarr,pipeline.build"
    code = bva.CHILD.replace("from pipeline.cli", "assert 'zarr' in sys.modules\nfrom pipeline.cli")
    assert code != bva.CHILD
    p = subprocess.run(
        [sys.executable, "-c", code, preload, "--help"], cwd=repo, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    assert "build" in p.stdout
    assert json.loads(p.stderr.splitlines()[0])["imports_s"] > 0
    nothing = subprocess.run(  # --imports-cost's other side: nothing imported first
        [sys.executable, "-c", bva.CHILD, "", "--help"], cwd=repo, capture_output=True, text=True
    )
    assert nothing.returncode == 0, nothing.stderr


def test_imports_cost_alternates_lazy_and_preloaded_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--imports-cost`: our build with nothing imported first and with PRELOAD first, taking
    turns (A B, B A), and the per-round differences lazy - preloaded."""
    import benchmarks.build_vs_annbatch as bva

    calls: list[bool] = []

    def once(manifest: Path, out: Path, jobs: int, preload: tuple[str, ...]) -> tuple[float, float]:
        calls.append(bool(preload))
        return (1.0, 0.4) if preload else (1.5 + len(calls), 0.0)

    monkeypatch.setattr(bva, "ours_once", once)
    rec = bva.imports_cost(tmp_path / "m.toml", 2)
    assert calls == [True, False, False, True]
    assert rec["lazy_s"] == [3.5, 4.5] and rec["preloaded_s"] == [1.0, 1.0]
    assert rec["diffs"] == [2.5, 3.5] and rec["median"] == 3.0
