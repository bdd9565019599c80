"""What limits a cold epoch of the remote bench (benchmarks/remote_bench.py) on this machine, where
the S3 server shares the loader's cores: the CPU each kind of work needs (`cpu_figures`,
`cpu_ceiling`) and the order the work must run in (`order_ceiling`). Pure functions over the
bench's measurements, apart from the readers of CPU time; docs/REMOTE.md, "What a cold epoch needs
on 2 cores".
"""

from __future__ import annotations

import os
import resource
import statistics
from typing import Any


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's children that have ended (an epoch's decoder
    process is one: stopped and waited for when its loader is torn down)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_ceiling(cores: int, local_cpu_per_cell: float, get_cpu_per_cell: float) -> float:
    """The most cells/s a cold epoch can reach when the server shares the machine's cores with
    the loader: each cell costs at least what a local epoch spends on it (decode, batches) plus
    what the raw GETs spend on its bytes (server and client), and ``cores`` CPU-seconds pass per
    second. Why: it tells a cold epoch held back by the cores from one held back by the order
    of its work (docs/REMOTE.md, "What a cold epoch needs on 2 cores")."""
    need = local_cpu_per_cell + get_cpu_per_cell
    return cores / need if need > 0 else float("inf")


def cpu_figures(
    runs: dict[str, list[dict[str, float]]],
    gets: list[dict[str, float]],
    cells: int,
    bound: float,
) -> dict[str, Any]:
    """CPU seconds per million cells (medians over rounds) of a local epoch, of the raw GETs of
    the split's objects (server + client) and of a cold epoch (this process, its decoder process
    and the server), the cores the cold epoch kept busy, and `cpu_ceiling` over ``bound``."""
    per_m = {
        "local": statistics.median(x["cpu_s"] for x in runs["local"]) * 1e6 / cells,
        "raw_get": statistics.median(g["cpu_s"] for g in gets) * 1e6 / cells,
        "cold": statistics.median(x["cpu_s"] + x["server_cpu_s"] for x in runs["cold"])
        * 1e6
        / cells,
    }
    cores = usable_cores()
    ceiling = cpu_ceiling(cores, per_m["local"] / 1e6, per_m["raw_get"] / 1e6)
    busy = statistics.median((x["cpu_s"] + x["server_cpu_s"]) / x["epoch_s"] for x in runs["cold"])
    return {
        "cores": cores,
        "cpu_s_per_million_cells": {k: round(v, 3) for k, v in per_m.items()},
        "cold_cores_busy": round(busy, 2),
        "cpu_ceiling_cells_s": round(ceiling),
        "cpu_ceiling_over_bound": round(ceiling / bound, 3) if bound > 0 else None,
    }


def order_ceiling(cells: int, get_s: float, serve_s: float, windows: int, bound: float) -> float:
    """The most a cold epoch can reach over ``bound`` (cells/s) by the order of its work alone,
    however well it overlaps the rest: a window serves no batch before every one of its shards
    is in the cache (each batch draws rows from all of them), so after the last byte lands
    (``get_s``: the split's bytes at the raw GET rate) at least the last window's batches are
    still to serve, ``serve_s / windows`` (``serve_s``: a local epoch's time from its first batch
    to its end, windows taken as equal). One window: nothing of the serving overlaps a
    download, so this is a true ceiling (a generous one: it leaves out the window's decode after
    its last shard lands). Several: ``serve_s`` also holds any wait for a later window's decode,
    so the figure is a guide, not a bound."""
    need = get_s + serve_s / max(1, windows)
    return cells / need / bound if need > 0 and bound > 0 else float("inf")


def order_figures(
    cells: int,
    limits: list[float],
    local_rates: list[float],
    serve_s: list[float],
    windows: int,
) -> dict[str, Any]:
    """`order_ceiling` of each round (its raw GET limit and local rate in cells/s, its local
    epochs' serving), their median, and the median of the rounds whose bound was the GET limit:
    there the ceiling is the order's alone, while a round whose local epochs ran slow (they are
    bimodal here: docs/REMOTE_MEASURED.md) lowers its own bound."""
    by_round = [
        order_ceiling(cells, cells / lim, s, windows, min(lim, lo))
        for lim, lo, s in zip(limits, local_rates, serve_s, strict=True)
    ]
    by_get = [x for x, lim, lo in zip(by_round, limits, local_rates, strict=True) if lim < lo]
    return {
        "windows": windows,
        "order_ceiling_over_bound": round(statistics.median(by_round), 3),
        "order_ceiling_by_round": [round(x, 3) for x in by_round],
        "order_ceiling_get_bound": round(statistics.median(by_get), 3) if by_get else None,
        "rounds_get_bound": len(by_get),
    }
