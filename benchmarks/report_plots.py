"""PNG plots of one results document (``docs/benchmarks/results.json``) for BENCHMARKS.md
(:mod:`benchmarks.report` writes the markdown around them). matplotlib is imported only when a plot
is drawn."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchmarks.locations import RESULTS_REL

PLOTS = (RESULTS_REL / "plots").as_posix()  # relative to OUT, as BENCHMARKS.md links it


def _plt() -> Any:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_loader(res: dict[str, Any], path: Path) -> Path | None:
    rows = [r for r in res.get("loader", {}).get("results", []) if r["cells_per_s"] > 0]
    if not rows:
        return None
    plt = _plt()
    rows = sorted(rows, key=lambda r: r["cells_per_s"])
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    colors = ["tab:blue" if r["method"].startswith("shards") else "tab:gray" for r in rows]
    ax.barh([r["method"] for r in rows], [r["cells_per_s"] for r in rows], color=colors)
    ax.set_xscale("log")
    ax.set_xlim(right=max(r["cells_per_s"] for r in rows) * 3)
    ax.set_xlabel(
        "cells/s delivered as dense float32 (log scale; epoch boundaries included, median of repeats)"
    )
    ds = res["datasets"]["main"]
    ax.set_title(
        f"Random batches, {ds['n_cells']:,} cells x {ds['n_genes']:,} genes (blue: shardsmith loader)"
    )
    for i, r in enumerate(rows):
        ax.text(r["cells_per_s"], i, f" {r['cells_per_s']:,.0f}", va="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_build(res: dict[str, Any], path: Path) -> Path | None:
    pipe = res.get("pipeline", {})
    sweep = [b for b in pipe.get("sweep", []) if b.get("rc") == 0]
    if not sweep:
        return None
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    n = [b["n_cells"] for b in sweep]
    ax1.plot(n, [b["peak_rss_mb"] for b in sweep], "o-", label="build peak RSS (all processes)")
    ax1.axhline(1024, color="tab:red", ls="--", label="target 1 GiB")
    ax1.set_xlabel("cells in the dataset")
    ax1.set_ylabel("MiB")
    ax1.set_ylim(bottom=0)
    ax1.set_title(f"Peak RSS vs dataset size (--jobs {sweep[0]['jobs']})")
    ax1.legend(fontsize=8)
    labels, vals = [], []
    for codec, lim in pipe.get("codec_limit", {}).items():
        labels.append(f"limit {codec}\n(1 thread)")
        vals.append(lim["cells_per_s"])
    for b in [*pipe.get("jobs", []), pipe.get("zstd") or {}]:
        if b.get("rc") == 0:
            labels.append(f"build {b['codec']}\n--jobs {b['jobs']} (per job)")
            vals.append(b["cells_per_s_per_job"])
    ax2.bar(
        range(len(vals)),
        vals,
        color=["tab:gray" if lb.startswith("limit") else "tab:blue" for lb in labels],
    )
    ax2.set_xticks(range(len(vals)), labels, fontsize=7)
    ax2.set_yscale("log")
    ax2.set_ylabel("cells/s (log)")
    ax2.set_title("Build throughput per job vs codec-bound limit")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_incremental(res: dict[str, Any], path: Path) -> Path | None:
    inc = res.get("pipeline", {}).get("incremental", {})
    if not inc.get("changed"):
        return None
    plt = _plt()
    names = ["full build", f"1 of {inc['files']} changed", "no change", "digest of sources"]
    vals = [
        inc["full"]["wall_s"],
        inc["changed"]["wall_s"],
        inc["nochange"]["wall_s"],
        inc["hash_s"],
    ]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(names, vals, color=["tab:gray", "tab:blue", "tab:blue", "tab:olive"])
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.2f}s", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds (wall, CLI process)")
    ax.set_title(f"Rebuild times, {inc['full']['n_cells']:,} cells in {inc['files']} files")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_plots(res: dict[str, Any], out: Path) -> dict[str, str]:
    folder = out / PLOTS
    folder.mkdir(parents=True, exist_ok=True)
    made = {}
    for name, fn in (
        ("loader", plot_loader),
        ("build", plot_build),
        ("incremental", plot_incremental),
    ):
        p = fn(res, folder / f"{name}.png")
        if p is not None:
            made[name] = p.relative_to(out).as_posix()
    return made
