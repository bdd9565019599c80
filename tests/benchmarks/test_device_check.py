"""benchmarks/device_check.py without a GPU: every GPU part says "not measured" (never a CPU figure
passed off as a GPU one) and the results file is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import device_check

pytestmark = pytest.mark.bench  # the benchmark harness (benchmarks/)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answer")
def test_without_cuda_every_gpu_part_is_not_measured(tmp_path: Path) -> None:
    assert (
        device_check.main(
            [
                "--data",
                str(tmp_path / "absent"),
                "--out",
                str(tmp_path),
                "--parts",
                "cells_parity,gpu_cells,gpu_spike",
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "device.json").read_text())
    assert res["gpu"] is None
    assert res["gpu_cells"]["status"].startswith("not measured")
    assert res["gpu_spike"]["status"].startswith("not measured")
    assert res["cells_parity"] == [{"status": "not measured (no CUDA device)"}]
