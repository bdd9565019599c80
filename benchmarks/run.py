"""Run the benchmarks and write BENCHMARKS.md, docs/benchmarks/results.json and docs/benchmarks/plots/*.png
under --out.

    python -m benchmarks.run --full  --out .                 # ~15 min on 2 cores: 200k x 2k, sizes
    50k..400k
    python -m benchmarks.run --quick --out bench_data/quick  # < 2 min: 20k x 500

Generated data is cached by parameters under --data-dir (default bench_data/, gitignored); shards
and logs go to DATA_DIR/work/<mode>/ and are rebuilt on every run.
"""

# The docstring above is `--help`. This module is the orchestration: it calls the section runners
# (benchmarks/run_sections.py) in order and assembles results.json, the targets and BENCHMARKS.md;
# the Config, presets and arguments are benchmarks/run_config.py.

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import pipeline_bench as pb
from benchmarks.build_vs_annbatch import build_annbatch_section
from benchmarks.extras_bench import extras_section
from benchmarks.locations import RESULTS_REL
from benchmarks.measure import machine_info, package_versions
from benchmarks.modality_sections import modality_section
from benchmarks.remote_bench import remote_section
from benchmarks.remote_link_bench import link_section
from benchmarks.report import write_report
from benchmarks.report_bench import report_section
from benchmarks.run_config import parse_args
from benchmarks.run_sections import (
    annbatch_section,
    datasets,
    gpu_section,
    loader_section,
    pipeline_section,
)
from benchmarks.targets import SMOKE_NOTE, as_smoke, evaluate


def main(argv: list[str] | None = None) -> int:
    cfg, a = parse_args(argv, __doc__)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    t0 = time.perf_counter()
    out, data_dir = a.out.resolve(), a.data_dir.resolve()
    work = data_dir / "work" / cfg.mode
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    notes: list[str] = []
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "config": {**asdict(cfg), "sentence_batch": cfg.sentence_batch},
        "machine": machine_info(),
        "packages": package_versions(),
        "notes": notes,
        "page_cache": "warm (files read once before each measurement; caches never dropped)",
        "load_avg_start": list(os.getloadavg()),
    }
    print(
        f"[bench] mode {cfg.mode}: {cfg.n_cells} cells x {cfg.n_genes} genes, sizes {cfg.sizes}",
        flush=True,
    )
    if cfg.mode != "full":
        print(f"[bench] {SMOKE_NOTE}", flush=True)
    _base, by_size, incr = datasets(cfg, data_dir)
    main_ds = by_size[cfg.n_cells]
    res["datasets"] = {
        "main": main_ds.to_json(),
        "sizes": {str(n): d.to_json() for n, d in by_size.items()},
        "incremental": incr.to_json(),
    }
    roots: dict[str, Path] = {}
    why = pb.pipeline_available() if "pipeline" not in skip else "skipped (--skip pipeline)"
    if why:
        res["pipeline"] = {"skipped": why}
        notes.append(f"pipeline not measured: {why}.")
    else:
        try:
            res["pipeline"] = pipeline_section(cfg, by_size, incr, work, roots)
        except Exception as e:  # report what broke and still measure the loaders
            traceback.print_exc()
            res["pipeline"] = {"skipped": f"the pipeline benchmark failed: {type(e).__name__}: {e}"}
            notes.append(res["pipeline"]["skipped"])
    res["loader"] = loader_section(cfg, main_ds, roots, work, skip, notes)
    res["annbatch"] = annbatch_section(cfg, a, main_ds, roots, data_dir, work, skip)
    res["build_annbatch"] = build_annbatch_section(
        cfg, main_ds.files[0], work, data_dir, skip, a.torch_spec
    )
    res["gpu"] = gpu_section(cfg, main_ds, roots, work, skip)
    res["spike"] = modality_section("spike", cfg, data_dir, work, skip, notes)
    res["ct"] = modality_section("ct", cfg, data_dir, work, skip, notes)
    res["remote"] = remote_section(cfg, roots, skip, notes)  # before the shards are removed
    res["remote_link"] = link_section(cfg, data_dir, skip, notes)  # its own build, shaped link
    res["extras"] = extras_section(cfg, roots, skip, notes)  # as the line above
    res["report"] = report_section(cfg, roots, res, skip, notes)  # as the line above
    if not a.keep_shards:
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)
    res["targets"] = evaluate(res) if cfg.mode == "full" else as_smoke(evaluate(res))
    res["total_s"] = time.perf_counter() - t0
    res["load_avg_end"] = list(os.getloadavg())
    (out / RESULTS_REL).mkdir(parents=True, exist_ok=True)
    md = write_report(res, out)
    (out / RESULTS_REL / "results.json").write_text(json.dumps(res, indent=1, default=str))
    for t in res["targets"]:
        print(f"[target {t['name']}] {t.get('by', t['status'])} - {t['what']}", flush=True)
    print(
        f"[bench] wrote {md} and {out / RESULTS_REL / 'results.json'} in {res['total_s']:.0f}s",
        flush=True,
    )
    if cfg.mode != "full":
        print(f"[bench] {SMOKE_NOTE}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
