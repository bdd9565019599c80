"""`make bench`'s spike and CT sections (benchmarks/run.py calls them after the perturbation
sections of benchmarks/run_sections.py): each modality's own bench, full size or, in quick mode,
tiny corpora that exercise the harness."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from benchmarks.run_config import Config


def modality_section(
    name: str, cfg: Config, data_dir: Path, work: Path, skip: set[str], notes: list[str]
) -> dict[str, Any]:
    """The spike or CT figures (benchmarks/spike_bench.py, ct_bench.py), measured in this process;
    quick mode uses tiny corpora (the harness is exercised, the figures are not meaningful)."""
    if name in skip:
        return {"skipped": f"--skip {name}"}
    print(f"[bench] {name}", flush=True)
    try:
        if name == "spike":
            from benchmarks.spike_bench import SpikeBenchConfig, run_spike_bench

            sc = (
                SpikeBenchConfig()
                if cfg.mode == "full"
                else SpikeBenchConfig(
                    height=64,
                    width=96,
                    sequences=2,
                    frames_per_sequence=4,
                    file_frames=48,
                    window=40,
                    crop=(32, 32),
                    batch_size=2,
                    seconds=0.05,
                    repeats=1,
                    build_jobs=1,
                )
            )
            return run_spike_bench(data_dir, work / "spike", sc)
        from benchmarks.ct_bench import CtBenchConfig, run_ct_bench

        cc = (
            CtBenchConfig()
            if cfg.mode == "full"
            else CtBenchConfig(
                loader_shape=(64, 64, 24),
                loader_volumes=3,
                build_shape=(64, 64, 32),
                build_volumes=2,
                seconds=0.05,
                repeats=1,
                build_jobs=1,
            )
        )
        return run_ct_bench(data_dir, work / "ct", cc)
    except Exception as e:  # reported; the smoke test fails on it
        traceback.print_exc()
        notes.append(f"{name} benchmark failed: {type(e).__name__}: {e}")
        return {"error": f"{type(e).__name__}: {e}"}
