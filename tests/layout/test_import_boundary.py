"""What importing the loader pulls in: trainers import `loaders` without the pipeline's stack, and
the decoder process (and everything it imports) never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # each check imports in a fresh interpreter

ROOT = Path(__file__).resolve().parents[2]
PIPELINE_ONLY = ("pipeline", "anndata", "h5py", "joblib", "pandas")


def _modules(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return {m.split(".")[0] for m in json.loads(out.stdout.strip().splitlines()[-1])}


def test_loaders_pull_in_nothing_of_the_pipeline() -> None:
    mods = _modules(
        "import loaders; loaders.ShardDataset; loaders.ShardLoader; import loaders.samples"
    )
    assert "torch" in mods  # the check itself works: ShardDataset does import torch
    assert not mods & set(PIPELINE_ONLY), sorted(mods & set(PIPELINE_ONLY))


@pytest.mark.parametrize(
    "module",
    [
        "loaders.engine.decoder",
        "loaders.engine.window",
        "loaders.samples",
        "loaders.samples.gather",
        "loaders.samples.payload",
        "loaders.samples.kernels",
        "loaders.samples.arena",
    ],
)
def test_decoder_side_is_torch_free(module: str) -> None:
    mods = _modules(
        f"import {module}; import loaders.samples as s; [s.get_sample_type(n) for n in s.SAMPLE_TYPES]"
    )
    assert "torch" not in mods and not mods & set(PIPELINE_ONLY), sorted(
        mods & {"torch", *PIPELINE_ONLY}
    )
