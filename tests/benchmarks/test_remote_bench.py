"""The remote bench's ceilings (benchmarks/remote_limits.py): what a cold epoch can reach while the
server shares the loader's cores (`cpu_figures`) and by the order of its work (`order_ceiling`),
and the line `make bench` prints for 23b. No server here: the figures come from measurements given
by hand."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest

from benchmarks import remote_bench, remote_limits
from benchmarks.targets_extra import order_bound, remote_targets

pytestmark = pytest.mark.bench  # the benchmark harness (benchmarks/)


def test_ceiling_is_cores_over_the_cpu_each_cell_needs() -> None:
    # 4 us of local work and 6 us of GET work a cell: 10 us; 2 cores give 200k cells/s
    assert remote_limits.cpu_ceiling(2, 4e-6, 6e-6) == pytest.approx(200_000)
    assert remote_limits.cpu_ceiling(16, 4e-6, 6e-6) == pytest.approx(1_600_000)
    assert math.isinf(remote_limits.cpu_ceiling(2, 0.0, 0.0))


def _epoch(cpu_s: float, epoch_s: float, server: float | None = None) -> dict[str, float]:
    out = {"cpu_s": cpu_s, "epoch_s": epoch_s, "cells": 100_000}
    if server is not None:
        out["server_cpu_s"] = server
    return out


def test_cpu_figures_take_medians_per_million_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_limits, "usable_cores", lambda: 2)
    runs = {
        "local": [_epoch(0.4, 0.3), _epoch(0.5, 0.3), _epoch(0.9, 0.3)],  # median 0.5
        "warm": [],
        "cold": [_epoch(0.6, 0.8, 0.4), _epoch(0.7, 0.9, 0.5), _epoch(0.5, 1.0, 0.3)],
    }
    gets = [{"cpu_s": 0.5}, {"cpu_s": 0.4}, {"cpu_s": 0.6}]  # median 0.5
    fig = remote_limits.cpu_figures(runs, gets, 100_000, bound=150_000)
    assert fig["cores"] == 2
    assert fig["cpu_s_per_million_cells"] == {"local": 5.0, "raw_get": 5.0, "cold": 10.0}
    # 2 cores / (5 + 5 us a cell) = 200,000 cells/s, 1.333x a bound of 150,000
    assert fig["cpu_ceiling_cells_s"] == 200_000
    assert fig["cpu_ceiling_over_bound"] == pytest.approx(1.333, abs=1e-3)
    # cores busy: (0.6+0.4)/0.8 = 1.25, (0.7+0.5)/0.9 = 1.33, (0.5+0.3)/1.0 = 0.8 -> 1.25
    assert fig["cold_cores_busy"] == 1.25


@pytest.mark.process
def test_children_cpu_counts_an_ended_child() -> None:
    before = remote_limits.children_cpu_seconds()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert remote_limits.children_cpu_seconds() - before >= 0.3  # the child's, not this process's


def _remote_result() -> dict[str, Any]:
    """A remote section's figures without the ceilings (as `make bench` wrote them before)."""
    return {
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


def test_23b_line_says_the_ceiling_only_when_measured() -> None:
    rm = _remote_result()
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
    for e in epochs:
        e["serve_s"] = e["epoch_s"] - e["first_batch_s"]  # 0.3, 1.1, 0.6
    one = remote_bench.merge_epochs(epochs)
    # 3,000 cells in 3.0 s: 1,000 cells/s, which cells / epoch_s must give
    assert one["cells"] / one["epoch_s"] == pytest.approx(1000.0)
    assert one["cpu_s"] == pytest.approx(0.8)  # per epoch, as cpu_figures divides by cells
    assert one["serve_s"] == pytest.approx(2.0 / 3)
    assert (one["open_s"], one["first_batch_s"], one["epochs"]) == (0.1, 0.2, 3)


def test_order_ceiling_adds_the_last_windows_serving_to_the_downloads() -> None:
    # 100k cells; the GETs take 0.5 s (200k cells/s, the bound), serving 0.15 s after the first
    # batch: one window waits for every download, 100k / 0.65 s = 153,846 cells/s = 0.769x
    assert remote_limits.order_ceiling(100_000, 0.5, 0.15, 1, 200_000) == pytest.approx(
        100_000 / 0.65 / 200_000
    )
    # five windows: only the last one's serving (0.03 s) follows the last download
    assert remote_limits.order_ceiling(100_000, 0.5, 0.15, 5, 200_000) == pytest.approx(
        100_000 / 0.53 / 200_000
    )
    # a slower local epoch is the bound: the same order, over a lower bound
    assert remote_limits.order_ceiling(100_000, 0.5, 0.15, 1, 125_000) == pytest.approx(
        100_000 / 0.65 / 125_000
    )
    assert math.isinf(remote_limits.order_ceiling(100_000, 0.0, 0.0, 1, 1.0))


def test_23b_line_says_the_order_ceiling_only_when_measured() -> None:
    rm = _remote_result()
    assert order_bound(rm) == ""
    one = rm | {"windows": 1, "order_ceiling_over_bound": 0.7935}
    line = next(t for t in remote_targets(one) if t["name"] == "23b")["detail"]
    assert "the order of the work allows at most 0.79x (1 window:" in line
    five = order_bound(
        rm
        | {
            "windows": 5,
            "order_ceiling_over_bound": 0.9,
            "order_ceiling_get_bound": 0.771,
            "rounds_get_bound": 2,
        }
    )
    assert "at most 0.90x, 0.77x in the 2 rounds bound by the GET limit (5 windows:" in five


def test_order_figures_split_the_rounds_bound_by_the_get_limit() -> None:
    # 100k cells, one window; serving 0.1 s in every round
    fig = remote_limits.order_figures(
        100_000,
        limits=[200_000.0, 200_000.0, 250_000.0],
        local_rates=[300_000.0, 150_000.0, 400_000.0],
        serve_s=[0.1, 0.1, 0.1],
        windows=1,
    )
    # GET-bound rounds: 1 / ((0.5 + 0.1) * 2) = 0.833 and 1 / ((0.4 + 0.1) * 2.5) = 0.8;
    # the local-bound round: 100k / 0.6 s / 150k = 1.111
    assert fig["order_ceiling_by_round"] == [0.833, 1.111, 0.8]
    assert fig["order_ceiling_over_bound"] == 0.833
    assert fig["rounds_get_bound"] == 2
    assert fig["order_ceiling_get_bound"] == pytest.approx(0.8167, abs=1e-3)
    none = remote_limits.order_figures(100_000, [200_000.0], [100_000.0], [0.1], 1)
    assert (none["order_ceiling_get_bound"], none["rounds_get_bound"]) == (None, 0)
