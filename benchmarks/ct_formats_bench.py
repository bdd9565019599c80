"""Build time per CT volume by source format, on the same arrays (part of ``make bench``'s CT
section).

    from benchmarks.ct_formats_bench import run_formats_bench r = run_formats_bench(data_dir,
    work_dir, shape=(512, 512, 48), volumes=2)   # r["table"]: markdown python -m
    benchmarks.ct_formats_bench --data-dir bench_data --work-dir bench_data/work/ct_formats

The same ``volumes`` synthetic chests (pipeline.modalities.ct.demo) are written once as ``.npy``,
``.nii`` (memory-mapped by the reader), ``.nii.gz`` (decompressed into memory), ``.nrrd`` (gzip, as
3D Slicer saves) and DICOM series (one file per slice, read by pydicom), cached under ``data_dir``.
Each format is built ``repeats`` times with ``shardsmith build --jobs 1`` in a child process (one
volume at a time, so the figure is per volume, not a parallel throughput); the median build time
(the build's own, without the interpreter's start) is divided by the number of volumes. Every
format must give byte-identical shards to the ``.npy`` build or the bench fails: the readers are
timed doing the very same work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ct_measure import build
from benchmarks.measure import du
from pipeline.modalities.ct.demo import make_chest_volume

FORMATS = {  # name -> ([[sources]] body relative to the corpus folder, what is on disk)
    "npy": ('path = "{d}/npy/*.npy"', "npy"),
    "nifti (.nii)": ('path = "{d}/nii/*.nii"', "nii"),
    "nifti (.nii.gz)": ('path = "{d}/niigz/*.nii.gz"', "niigz"),
    "nrrd (gzip)": ('path = "{d}/nrrd/*.nrrd"', "nrrd"),
    "dicom": ('path = "{d}/dicom"\ntype = "dicom"', "dicom"),
}
SPACING, ORIGIN = (0.7, 0.7, 2.5), (179.0, 179.0, -60.0)


def corpus(data_dir: Path, shape: tuple[int, int, int], n: int) -> Path:
    """The same ``n`` chests in every format (written once; a ``.done`` marker says the set is
    whole)."""
    from pipeline.modalities.ct.writers import (
        chest_affine,
        write_dicom_series,
        write_nifti,
        write_nrrd,
    )

    d = data_dir / f"ct_formats_{'x'.join(map(str, shape))}_{n}"
    if (d / ".done").exists():
        return d
    aff = chest_affine(SPACING, ORIGIN)
    for i in range(n):
        hu = make_chest_volume(shape, 200 + i)[0]
        name = f"chest_{i:03d}"
        (d / "npy").mkdir(parents=True, exist_ok=True)
        np.save(d / "npy" / f"{name}.npy", hu)
        write_nifti(d / "nii" / f"{name}.nii", hu, aff)
        write_nifti(d / "niigz" / f"{name}.nii.gz", hu, aff)
        write_nrrd(d / "nrrd" / f"{name}.nrrd", hu, aff)
        write_dicom_series(d / "dicom" / name, hu, aff, seed=i)
    (d / ".done").write_text("")
    return d


def _manifest(path: Path, source: str, max_points: int) -> Path:
    path.write_text(f"""[dataset]
name = "bench-ct-formats"
kind = "ct"
format = "zarr"
seed = 0
shard_size_mb = 1

[[sources]]
{source}

[ct]
max_points = {max_points}

[split]
val_fraction = 0.0
test_fraction = 0.0
""")
    return path


def _content(out: Path) -> list[str]:
    """The shards' content hashes: equal when two builds stored the very same points and features."""
    from loaders.format import read_index

    return [e.digest for e in read_index(out).shards]


def run_formats_bench(
    data_dir: str | Path,
    work_dir: str | Path,
    shape: tuple[int, int, int] = (512, 512, 48),
    volumes: int = 2,
    repeats: int = 2,
    max_points: int = 500_000,
) -> dict[str, Any]:
    data_dir, work = Path(data_dir).resolve(), Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    d = corpus(data_dir, shape, volumes)
    rows: dict[str, dict[str, Any]] = {}
    ref = None
    for name, (source, folder) in FORMATS.items():
        m = _manifest(work / f"{folder}.toml", source.format(d=d), max_points)
        runs = [build(m, work / f"out_{folder}", 1) for _ in range(repeats)]
        got = _content(work / f"out_{folder}")
        ref = ref or got
        if got != ref:
            raise RuntimeError(
                f"formats bench: {name} stores other points than the .npy build "
                f"(shard sha256 {got} vs {ref}): its reader does not return the "
                "same arrays"
            )
        secs = statistics.median(r["build_seconds"] for r in runs)
        rows[name] = {
            "seconds_per_volume": secs / volumes,
            "build_seconds": [r["build_seconds"] for r in runs],
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
            "mb_on_disk": du(d / folder) / 1e6,
        }
    npy = rows["npy"]["seconds_per_volume"]
    for r in rows.values():
        r["vs_npy"] = r["seconds_per_volume"] / npy if npy else float("inf")
    return {
        "shape": list(shape),
        "volumes": volumes,
        "repeats": repeats,
        "formats": rows,
        "table": table(rows, shape, volumes, repeats),
    }


def table(
    rows: dict[str, dict[str, Any]], shape: tuple[int, int, int], volumes: int, repeats: int
) -> str:
    grid = "x".join(map(str, shape))
    lines = [
        f"CT build time per volume by source format: the same {volumes} chests of {grid} "
        f"int16, `--jobs 1`, median of {repeats} builds (the build's own time):",
        "",
        "| source | s / volume | vs .npy | on disk MB | peak RSS MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['seconds_per_volume']:.2f} | {r['vs_npy']:.2f}x | "
            f"{r['mb_on_disk']:.1f} | "
            f"{r['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="bench_data")
    ap.add_argument("--work-dir", default="bench_data/work/ct_formats")
    ap.add_argument("--shape", default="512,512,48")
    ap.add_argument("--volumes", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default="", help="also write the result dict here")
    a = ap.parse_args(argv)
    shape = tuple(int(x) for x in a.shape.split(","))
    r = run_formats_bench(
        a.data_dir, a.work_dir, (shape[0], shape[1], shape[2]), a.volumes, a.repeats
    )
    print(r["table"])
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1, default=str))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
