"""BENCHMARKS.md from one results document (``docs/benchmarks/results.json``), with the plots of
:mod:`benchmarks.report_plots`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.annbatch_bench import markdown as annbatch_md
from benchmarks.gpu import NOT_MEASURED
from benchmarks.locations import RESULTS, RESULTS_REL
from benchmarks.report_plots import make_plots
from benchmarks.targets import SMOKE_NOTE


def _load(v: list[float] | None) -> str:
    return "/".join(f"{x:.2f}" for x in v) if v else "-"


def _fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def loader_table(res: dict[str, Any]) -> list[str]:
    lines = [
        "| method | batch | cells/s | MB/s payload | first batch (s) | peak RSS (MiB) | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in res.get("loader", {}).get("results", []):
        lines.append(
            f"| {r['method']} | {r['params'].get('batch_size', '')} | {_fmt(r['cells_per_s'])} | "
            f"{_fmt(r['mb_per_s'])} | {_fmt(r['ttfb_s'], 3)} | {_fmt(r['peak_rss_mb'])} | {r['note']} |"
        )
    return lines


def interleaved_table(res: dict[str, Any]) -> list[str]:
    """The same-process, interleaved loader-vs-scipy figures (benchmarks/interleaved.py)."""
    il = res.get("loader", {}).get("interleaved")
    if not il:
        return []
    cfg = res["config"]
    lines = [
        "",
        "### Same process, interleaved (the ratios that count)",
        "",
        f"One interpreter holds every stream below for the whole run; they take turns, {il['seconds']:g} s "
        f"each (A, B, C, A, B, C ...), {il['rounds']} rounds. cells/s: median of a stream's windows; ratio: "
        "median over rounds of (window / its baseline's window in the same round). Baselines hold the whole "
        "matrix as one in-memory scipy CSR: `X[idx].toarray()` (dense) and `X[idx]` (CSR gather, its three "
        "arrays as tensors); our loader reads the train split's shards (`densify=False`: `X.crow`, `X.cols`, "
        "`X.vals` tensors). `window` in shards (the full data has 4 train shards: window 4 is the whole split, "
        "decoded once and re-shuffled every epoch; window 2 decodes every window of every epoch). Workers are "
        "persistent. Decode CPU: the decoder process's CPU seconds per epoch started in a stream's windows. "
        f"No RSS sampler runs while timing: tree RSS read between windows, max "
        f"{il['rss_between_windows_mib']:,.0f} MiB; sum of the processes' VmHWM {il['hwm_sum_mib']:,.0f} MiB "
        "(shared windows count once per process mapping them). Command: `python -m benchmarks.run "
        f"--{cfg['mode'].split('-')[0]}` (task spec in DATA_DIR/work/<mode>/task-interleaved.json; rerun alone "
        "with `python -m benchmarks.loaders_bench SPEC OUT`).",
        "",
        "| stream | cells/s | ratio | vs | epochs | decode CPU s/epoch | first batch (s) |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in il["results"]:
        dec = r.get("decode_cpu_s_per_epoch")
        lines.append(
            f"| {r['method']} | {_fmt(r['cells_per_s'])} | {_fmt(r.get('ratio'), 2)} | "
            f"{r.get('baseline', '')} | {r['epochs']} | {_fmt(dec, 3)} | {_fmt(r['ttfb_s'], 2)} |"
        )
    scan = il.get("workers_scan") or []
    if scan:
        lines += [
            "",
            "Workers share one decode (dense cells, window of 2 shards so that every epoch decodes, persistent "
            "workers, one warm-up epoch then the epochs below; not interleaved: read the CPU and memory columns, "
            "not the rate). Decode CPU: the decoder process's CPU seconds per epoch; worker CPU: all workers "
            "together (gather, assembly, transport); window memory: the most decoder-slab bytes alive at once "
            "(workers map those slabs instead of decoding their own).",
            "",
            "| num_workers | cells/s | decode CPU s/epoch | worker CPU s/epoch | windows decoded | "
            "peak window memory (MiB) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in scan:
            lines.append(
                f"| {r['num_workers']} | {_fmt(r['cells_per_s'])} | {_fmt(r['decode_cpu_s_per_epoch'], 3)} | "
                f"{_fmt(r['worker_cpu_s_per_epoch'], 2)} | {r['window_decodes'] or '-'} | "
                f"{_fmt(r['peak_window_mib'])} |"
            )
    return lines


def build_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| build | cells | --jobs | codec | wall (s) | own timer (s) | cells/s | cells/s per job | source MB/s "
        "| peak RSS (MiB) | shards written/reused | stored MB |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    seen = set()
    for b in runs:
        if not b or b["label"] in seen:
            continue
        seen.add(b["label"])
        if b.get("rc") != 0:
            lines.append(
                f"| {b['label']} | {b['n_cells']:,} | {b['jobs']} | {b['codec']} | FAILED: {b['error']} |"
                " | | | | | | |"
            )
            continue
        lines.append(
            f"| {b['label']} | {b['n_cells']:,} | {b['jobs']} | {b['codec']} | {b['wall_s']:.2f} | "
            f"{b['internal_s']:.1f} | "
            f"{_fmt(b['cells_per_s'])} | {_fmt(b['cells_per_s_per_job'])} | {_fmt(b['mb_per_s'], 1)} | "
            f"{_fmt(b['peak_rss_mb'])} | {b['written']}/{b['reused']} | {b['stored_bytes'] / 1e6:.1f} |"
        )
    return lines


def markdown(res: dict[str, Any], plots: dict[str, str]) -> str:
    m, cfg, ds = res["machine"], res["config"], res["datasets"]["main"]
    L = [
        "# Benchmarks",
        "",
        f"Generated by `python -m benchmarks.run --{cfg['mode']}` on {res['date']} in {res['total_s']:.0f}s. "
        "Every figure is in `docs/benchmarks/results.json`.",
        "",
        *([f"**{SMOKE_NOTE[0].upper() + SMOKE_NOTE[1:]}.**", ""] if cfg["mode"] != "full" else []),
        "## Machine",
        "",
        f"- {m['cpu_model']}; {m['cpu_count_logical']} logical CPUs ({m['cpu_affinity']} usable), "
        f"{m['ram_gib']} GiB RAM; {m['platform']}; Python {m['python']}",
        "- packages: " + ", ".join(f"{k} {v}" for k, v in res["packages"].items()),
        f"- load average (1/5/15 min) at start {_load(res.get('load_avg_start'))}, at end "
        f"{_load(res.get('load_avg_end'))}: above ~0.2 x CPUs at the start, something else was running and the "
        "timings are perturbed",
        "",
        "## Data",
        "",
        f"Synthetic scPerturb-like dataset (`benchmarks/synth.py`): {ds['n_cells']:,} cells x "
        f"{ds['n_genes']:,} genes, "
        f"{ds['nnz_fraction']:.1%} nonzero (float32 CSR, 1 + negative-binomial counts), {ds['n_perturbations']} "
        f"perturbations + control (~{ds['control_fraction']:.0%} of cells), {ds['n_cell_types']} cell types, "
        f"{ds['n_batches']} batches, {ds['n_timepoints']} timepoints; {ds['file_bytes'] / 1e6:,.0f} MB .h5ad "
        f"({f'generated in {gen:.1f}s' if (gen := ds['generate_s']) else 'cached from an earlier run'}). "
        f"Shards: `pairing.sentence_size = {cfg['sentence_size']}`, "
        f"`shard_size_mb = {cfg['shard_size_mb']}`.",
        "",
    ]
    L += ["## Targets", "", "| # | target | measured | status |", "|---|---|---:|---|"]
    for t in res["targets"]:
        val = "-" if t["value"] is None else f"{t['value']:.3g} {t.get('unit', '')}"
        status = f"**{t['by']}**" if t.get("by") else t["status"]
        L.append(
            f"| {t['name']} | {t['what']}{'<br>' + t['detail'] if t.get('detail') else ''} | {val} | {status} |"
        )
    L += [
        "",
        "## Loader",
        "",
        f"Random batches of {cfg['batch_size']} cells (sentences: {cfg['sentence_batch']} sentence(s) of "
        f"{cfg['sentence_size']} perturbed + {cfg['sentence_size']} control cells per batch; pairs: "
        f"{cfg['batch_size']} pairs = {2 * cfg['batch_size']} cells), dense float32 at the end. cells/s counts "
        "every expression row delivered (pairs and sentences deliver control and perturbed rows). Measured: "
        f"time to first batch, then {cfg['warmup']} warm-up batches, then {cfg['seconds']}s of batches; median "
        f"of {cfg['repeats']} repeats. Epochs follow each other, each a fresh permutation (`set_epoch(e)`; the "
        "note says whether every epoch's first batch differed); the measured seconds span epoch boundaries, so "
        "each new epoch's start-up (reshuffle, first window decode) is paid inside them, as in training. Page cache warm: every file was read once before "
        "measuring, caches were not dropped. Peak RSS is the sum over the main process and its DataLoader "
        "workers, sampled every 50 ms (the process list every 250 ms); pages shared between processes (torch "
        "libraries, forked memory) count once per process, so num_workers=2 figures overstate real use. torch "
        "is imported before sampling starts. Each method runs in its own interpreter. Our loader reads the "
        "train split (80% of cells); baselines read the whole matrix.",
        "",
    ]
    if res.get("loader", {}).get("skipped"):
        L += [f"Not measured for our loader: {res['loader']['skipped']}.", ""]
    L += loader_table(res)
    L += interleaved_table(res)
    L += annbatch_md(res.get("annbatch"))
    if "loader" in plots:
        L += ["", f"![loader throughput]({plots['loader']})"]
    pipe = res.get("pipeline", {})
    L += ["", "## Pipeline", ""]
    if pipe.get("skipped"):
        L += [f"Not measured: {pipe['skipped']}.", ""]
    else:
        L += [
            "Builds run `python -m pipeline build MANIFEST --out DIR --jobs N` in a child process; wall time "
            "includes interpreter start and imports (the CLI's own timer, as it prints it, does not), peak RSS "
            "covers the CLI and its joblib workers. The codec-bound limit "
            "reads the source matrix with h5py in 8 MiB contiguous blocks and compresses the same bytes with "
            "numcodecs Blosc (level 5, byte shuffle, 1 thread), nothing else.",
            "",
            "| codec-bound limit | cells/s | MB/s | read share | compression ratio |",
            "|---|---:|---:|---:|---:|",
        ]
        for codec, lim in pipe.get("codec_limit", {}).items():
            L.append(
                f"| {codec} | {lim['cells_per_s']:,.0f} | {lim['mb_per_s']:,.0f} | "
                f"{lim['read_seconds'] / lim['seconds']:.0%} | {lim['ratio']:.2f} |"
            )
        L += [
            "",
            *build_table([*pipe.get("sweep", []), *pipe.get("jobs", []), pipe.get("zstd") or {}]),
        ]
        sp = pipe.get("speedup")
        if sp:
            L += [
                "",
                f"`--jobs 2` vs `--jobs 1` speed-up ({sp['n_cells']:,} cells): **{sp['speedup']:.2f}x**.",
            ]
        fl = pipe.get("rss_flatness", {})
        if fl.get("max_over_min"):
            L += [
                "",
                f"Peak RSS over sizes: max/min {fl['max_over_min']:.2f}, slope "
                f"{fl['slope_mb_per_100k_cells']:.0f} MiB per 100k cells.",
            ]
        inc = pipe.get("incremental", {})
        if inc.get("full") and not inc.get("changed"):
            L += [
                "",
                f"Incremental rebuild not measured: the full build failed ({inc['full']['error']}).",
            ]
        if inc.get("changed"):
            L += [
                "",
                f"Incremental rebuild ({inc['full']['n_cells']:,} cells in {inc['files']} files; "
                f"`{inc['changed_file']}` rewritten with changed values, same obs):",
                "",
                *build_table([inc["full"], inc["changed"], inc["nochange"]]),
                "",
                f"digest (xxh3-128) of all sources: {inc['hash_s']:.2f}s. Shards whose content changed: "
                f"{inc['shards_rehashed_different']} of {inc['shards_total']}.",
            ]
            dry = inc.get("dry_run")
            if dry:
                L += [
                    "",
                    f"`--dry-run` after the rewrite (scan, hash of the changed file, plan; writes nothing): "
                    f"{dry['wall_s']:.2f}s wall, peak RSS {dry['peak_rss_mb']:.0f} MiB; shards untouched: "
                    f"{dry['unchanged']}.",
                ]
        from benchmarks.cluster_bench import markdown as backends_md

        L += ["", *backends_md(pipe.get("backends", {}))]
        for key, title in (("build", "build"), ("incremental", "incremental rebuild")):
            if key in plots:
                L += ["", f"![{title}]({plots[key]})"]
    gpu = res.get("gpu", {})
    L += ["", "## GPU", ""]
    if gpu.get("status") != "measured":
        L += [gpu.get("status", NOT_MEASURED)]
        for f in sorted(
            (RESULTS / "device").glob("*.json")
        ):  # runs on lent GPU nodes
            doc = json.loads(f.read_text())
            command = doc.get("command", "python -m benchmarks.device_check")
            where = doc.get("summarised_in", 'docs/LOADER.md, "On a GPU", and docs/SPIKE.md')
            L += [
                "",
                f"Measured on a lent GPU node instead: `{RESULTS_REL.as_posix()}/device/{f.name}` "
                f"(`{command}`; summarised in {where}).",
            ]
    else:
        L += [
            f"Device: {gpu['device']}. H2D (pinned) {gpu['h2d_batch']['gb_per_s']:.1f} GB/s for one batch, "
            f"{gpu['h2d_64mb']['gb_per_s']:.1f} GB/s for 64 MiB. On-device densify (torch sparse CSR -> dense): "
            f"{gpu['densify']['cells_per_s']:,.0f} cells/s ({gpu['densify']['dense_gb_per_s']:.1f} GB/s dense).",
            "",
            "Loader rows: epochs after a warm-up epoch, persistent workers; `device=cuda` ships CSR parts and "
            "densifies on the GPU, `host` is the same loader with `device=None` in the same run. Wait: from asking "
            "for a batch to its being usable (synchronised).",
            "",
            "| loader | cells/s | first batch (s) | wait/batch median (ms) | p95 (ms) |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in gpu.get("loader", []):
            name = f"num_workers={r['num_workers']}, {r.get('device', 'cuda')}"
            if "error" in r:
                L.append(f"| {name} | FAILED: {r['error']} | | | |")
            else:
                L.append(
                    f"| {name} | {r['cells_per_s']:,.0f} | {r['ttfb_s']:.3f} | "
                    f"{_fmt(r['gpu_wait_ms_median'], 2)} | {_fmt(r['gpu_wait_ms_p95'], 2)} |"
                )
    for key, title in (("spike", "Spike"), ("ct", "CT")):
        sec = res.get(key) or {}
        L += ["", f"## {title}", ""]
        L.append(
            sec["table"]
            if "table" in sec
            else f"Not measured: {sec.get('skipped') or sec.get('error')}."
        )
    if res.get("notes"):
        L += ["", "## Notes", "", *[f"- {n}" for n in res["notes"]]]
    return "\n".join(L) + "\n"


def write_report(res: dict[str, Any], out: Path) -> Path:
    plots = make_plots(res, out)
    res["plots"] = plots
    path = out / "BENCHMARKS.md"
    analysis = RESULTS / "ANALYSIS.md"  # hand-written: what limits each missed target, and why
    tail = "\n" + analysis.read_text() if analysis.exists() else ""
    scale = RESULTS / "SCALE.md"  # `make bench-scale` (too long for make bench): its last run
    tail = ("\n" + scale.read_text() if scale.exists() else "") + tail
    path.write_text(markdown(res, plots) + tail)
    return path
