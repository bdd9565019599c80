"""docs/EXTENDING.md runs as written: its plug-in module, manifest, commands and trainer snippet."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "EXTENDING.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def test_extending_walkthrough_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.cli import main as cli

    module, trainer = _blocks("python")
    (tmp_path / "pointclouds.py").write_text(module)
    (tmp_path / "clouds.toml").write_text(_blocks("toml")[0])
    (tmp_path / "clouds").mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):  # 4 scenes; cloud 11 has one point: skipped by min_points = 2
        n = 1 if i == 11 else int(rng.integers(2, 9))
        doc = {"scene": f"s{i % 4}", "label": int(i % 10), "points": rng.standard_normal((n, 3)).round(3).tolist()}
        (tmp_path / "clouds" / f"{i:02d}.pts.json").write_text(json.dumps(doc))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for command in _blocks("bash")[0].strip().split("&&"):
        args = shlex.split(command)
        assert args[0] == "shardsmith"
        assert cli(args[1:]) == 0, command
    index = json.loads((tmp_path / "shards" / "clouds" / "index.json").read_text())
    assert index["stats"]["skipped"] == {"too few points": 1}
    seen = []
    namespace: dict = {}
    exec(compile(trainer, "EXTENDING.md", "exec"), namespace)  # noqa: S102 - the doc's own snippet
    batch = namespace["batch"]
    assert batch["offsets"][-1] == batch["points"].shape[0]
    for split in ("train", "test"):
        ds = namespace["ShardDataset"]("shards/clouds", split=split, sample="clouds", batch_size=5, shuffle=False)
        for b in ds:
            seen += b["sample_id"].tolist()
    assert sorted(seen) == list(range(11))
    sys.modules.pop("pointclouds", None)
