"""The remote bench's CPU accounting (benchmarks/remote_bench.py, `cpu_figures`): what a cold epoch
can reach while the server shares the loader's cores, and the line `make bench` prints for 23b.
No server here: the figures come from measurements given by hand."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from benchmarks import remote_bench
from benchmarks.targets_extra import remote_targets


def test_ceiling_is_cores_over_the_cpu_each_cell_needs() -> None:
    # 4 us of local work and 6 us of GET work a cell: 10 us; 2 cores give 200k cells/s
    assert remote_bench.cpu_ceiling(2, 4e-6, 6e-6) == pytest.approx(200_000)
    assert remote_bench.cpu_ceiling(16, 4e-6, 6e-6) == pytest.approx(1_600_000)
    assert math.isinf(remote_bench.cpu_ceiling(2, 0.0, 0.0))


def _epoch(cpu_s: float, epoch_s: float, server: float | None = None) -> dict[str, float]:
    out = {"cpu_s": cpu_s, "epoch_s": epoch_s, "cells": 100_000}
    if server is not None:
        out["server_cpu_s"] = server
    return out


def test_cpu_figures_take_medians_per_million_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_bench, "usable_cores", lambda: 2)
    runs = {
        "local": [_epoch(0.4, 0.3), _epoch(0.5, 0.3), _epoch(0.9, 0.3)],  # median 0.5
        "warm": [],
        "cold": [_epoch(0.6, 0.8, 0.4), _epoch(0.7, 0.9, 0.5), _epoch(0.5, 1.0, 0.3)],
    }
    gets = [{"cpu_s": 0.5}, {"cpu_s": 0.4}, {"cpu_s": 0.6}]  # median 0.5
    fig = remote_bench.cpu_figures(runs, gets, 100_000, bound=150_000)
    assert fig["cores"] == 2
    assert fig["cpu_s_per_million_cells"] == {"local": 5.0, "raw_get": 5.0, "cold": 10.0}
    # 2 cores / (5 + 5 us a cell) = 200,000 cells/s, 1.333x a bound of 150,000
    assert fig["cpu_ceiling_cells_s"] == 200_000
    assert fig["cpu_ceiling_over_bound"] == pytest.approx(1.333, abs=1e-3)
    # cores busy: (0.6+0.4)/0.8 = 1.25, (0.7+0.5)/0.9 = 1.33, (0.5+0.3)/1.0 = 0.8 -> 1.25
    assert fig["cold_cores_busy"] == 1.25


def test_children_cpu_counts_an_ended_child() -> None:
    before = remote_bench.children_cpu_seconds()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert remote_bench.children_cpu_seconds() - before >= 0.3  # the child's, not this process's


def test_23b_line_says_the_ceiling_only_when_measured() -> None:
    rm = {
        "setup": "x",
        "cells_per_s": {"local": 300_000, "warm": 290_000, "cold": 170_000},
        "raw_get_limit_cells_s": 310_000,
        "raw_get_MB_s": 180.0,
        "cold_over_bound": 0.567,
        "cold_first_batch_s": 1.0,
        "local_first_batch_s": 0.2,
        "cold_peak_cache_bytes": 10,
        "cold_network_bytes_per_epoch": 10,
    }
    plain = next(t for t in remote_targets(rm) if t["name"] == "23b")
    assert "allow a cold epoch" not in plain["detail"]
    rm |= {
        "cores": 2,
        "cpu_s_per_million_cells": {"local": 4.4, "raw_get": 4.66, "cold": 9.8},
        "cold_cores_busy": 1.63,
        "cpu_ceiling_cells_s": 220_806,
        "cpu_ceiling_over_bound": 0.702,
    }
    line = next(t for t in remote_targets(rm) if t["name"] == "23b")["detail"]
    assert "2 cores allow a cold epoch at most 220,806 cells/s = 0.70x the bound" in line
    assert "local epoch 4.40, raw GETs 4.66 (server + client), cold epoch 9.80" in line


def test_a_round_of_epochs_reads_as_all_its_cells_over_all_its_time() -> None:
    epochs = [
        {"open_s": 0.1, "first_batch_s": 0.2, "epoch_s": 0.5, "cells": 1000, "cpu_s": 0.6},
        {"open_s": 0.3, "first_batch_s": 0.4, "epoch_s": 1.5, "cells": 1000, "cpu_s": 1.0},
        {"open_s": 0.3, "first_batch_s": 0.4, "epoch_s": 1.0, "cells": 1000, "cpu_s": 0.8},
    ]
    one = remote_bench.merge_epochs(epochs)
    # 3,000 cells in 3.0 s: 1,000 cells/s, which cells / epoch_s must give
    assert one["cells"] / one["epoch_s"] == pytest.approx(1000.0)
    assert one["cpu_s"] == pytest.approx(0.8)  # per epoch, as cpu_figures divides by cells
    assert (one["open_s"], one["first_batch_s"], one["epochs"]) == (0.1, 0.2, 3)
