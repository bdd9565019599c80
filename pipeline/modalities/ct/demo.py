"""Small synthetic chest CTs, int16 Hounsfield units, written as ``.npy`` (+ optional sidecar) like
real exports, and one each as NIfTI, a DICOM series and NRRD (:func:`write_formats`), so the demo
build reads every format.

Each volume has what makes real chest CT hard to sparsify well: air (-1000 HU) all around an
elliptical body (fat ring -100, soft tissue +40), two lungs (-850) *inside* the body, a trachea
joining the lungs to the top of the volume (so a 3-D hole fill would miss the lungs), a spine and
ribs (+700), and a patient table below the body, separated from it by air (the largest-component
step drops it). Axial slices are along the last axis (``axial_axis = -1``), the neck at the top
(high z). Content is a function of the arguments (seeded), and :func:`make_chest_volume` also
returns the lung mask it drew, so the demo can say what the default settings keep.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loaders.format import atomic_write_bytes
from pipeline.modalities.ct.writers import chest_affine, write_dicom_series, write_nifti, write_nrrd

AIR, FAT, SOFT, LUNG, BONE, TABLE = -1000, -100, 40, -850, 700, 100


@dataclass(frozen=True)
class ChestSpec:
    """One demo volume: its file stem, grid, seed and (optional) sidecar spacing/origin."""

    stem: str
    shape: tuple[int, int, int]
    seed: int
    spacing: tuple[float, float, float] | None = None
    origin: tuple[float, float, float] | None = None


DEMO_VOLUMES = (
    ChestSpec("chest_000", (64, 64, 24), 11, (0.78, 0.78, 2.5), (-25.0, -25.0, -60.0)),
    ChestSpec("chest_001", (80, 72, 28), 12),
    ChestSpec("chest_002", (96, 96, 32), 13, (0.6, 0.6, 2.0), (-28.8, -28.8, -64.0)),
    ChestSpec("chest_003", (72, 64, 20), 14, (0.7, 0.8, 3.0)),
)
FORMAT_VOLUMES = (  # written through nibabel, pydicom and pynrrd (pipeline.modalities.ct.writers)
    ChestSpec("chest_004", (72, 72, 24), 15, (0.7, 0.7, 2.5), (25.2, 27.0, -58.0)),
    ChestSpec("chest_005", (64, 56, 20), 16, (0.8, 0.8, 3.0), (25.6, 20.0, -57.0)),
    ChestSpec("chest_006", (64, 64, 22), 17, (0.75, 0.75, 2.5), (24.0, 26.0, -52.5)),
)
FORMAT_FILES = (
    ("nifti", "chest_004.nii.gz"),
    ("dicom", "dicom/chest_005"),
    ("nrrd", "chest_006.nrrd"),
)


def make_chest_volume(
    shape: tuple[int, int, int], seed: int, noise: float = 15.0, rows: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(hu int16 [X, Y, Z], lungs bool [X, Y, Z])``: a chest-like volume and the lung voxels it
    drew. ``rows=(a, b)`` makes only rows ``[a, b)`` of axis 0 (the same voxels as the whole
    volume's), so a 512^3 volume can be written a slab at a time."""
    rng = np.random.default_rng(seed)
    nx, ny, nz = shape
    a, b = rows or (0, nx)
    x = (np.arange(a, b, dtype=np.float32)[:, None, None] + 0.5) / nx
    y = (np.arange(ny, dtype=np.float32)[None, :, None] + 0.5) / ny
    z = (np.arange(nz, dtype=np.float32)[None, None, :] + 0.5) / nz
    cx, cy = 0.5 + rng.uniform(-0.02, 0.02), 0.47 + rng.uniform(-0.02, 0.02)
    neck = z > 0.86
    ax = np.where(
        neck, 0.15, 0.40 * rng.uniform(0.92, 1.05)
    )  # body half-widths (fraction of the grid)
    ay = np.where(neck, 0.15, 0.30 * rng.uniform(0.92, 1.05))
    r_body = np.sqrt(((x - cx) / ax) ** 2 + ((y - cy) / ay) ** 2)  # 1 on the skin
    shape = (b - a, ny, nz)
    vol = np.full(shape, AIR, dtype=np.float32)
    vol[r_body <= 1.0] = FAT
    vol[r_body <= 0.86] = SOFT
    ribs = (r_body > 0.80) & (r_body < 0.85) & (y > cy - 0.1) & ~neck & (np.floor(z * nz) % 4 == 0)
    vol[ribs] = BONE
    spine = ((x - cx) ** 2 + (y - cy - 0.13) ** 2) < 0.045**2
    vol[np.broadcast_to(spine, shape)] = BONE
    lungs = np.zeros(shape, dtype=bool)
    z_lo, z_hi = 0.12, 0.80
    for side in (-1.0, 1.0):
        lx, ly = cx + side * 0.17, cy - 0.03
        sx, sy, sz = 0.12 * rng.uniform(0.9, 1.1), 0.17 * rng.uniform(0.9, 1.1), (z_hi - z_lo) / 2
        lungs |= ((x - lx) / sx) ** 2 + ((y - ly) / sy) ** 2 + (
            (z - (z_lo + z_hi) / 2) / sz
        ) ** 2 <= 1.0
    vol[lungs] = LUNG
    # trachea: a tube from the carina (z = 0.62) up through the neck to the top slice, bronchi to
    # each lung
    r_tr = max(1.6 / nx, 0.035)
    tx, ty, carina = cx, cy - 0.06, 0.62
    airway = (((x - tx) ** 2 + (y - ty) ** 2) < r_tr**2) & (z >= carina)
    for side in (
        -1.0,
        1.0,
    ):  # a tube from the carina into each lung, shallow enough to stay 6-connected
        t = np.clip((carina - z) / (carina - 0.46), 0.0, 1.0)
        bx, by = tx + side * 0.10 * t, ty + 0.03 * t
        airway |= (
            (((x - bx) ** 2 + (y - by) ** 2) < (1.3 * r_tr) ** 2) & (z <= carina) & (z >= 0.46)
        )
    vol[airway] = AIR
    table = (y > cy + 0.36) & (y < cy + 0.40) & (x > 0.08) & (x < 0.92)
    vol[np.broadcast_to(table, shape)] = TABLE
    for i in range(a, b):  # noise seeded per row: a slab holds the same voxels as the whole volume
        vol[i - a] += (
            np.random.default_rng([seed, i]).normal(0.0, noise, size=(ny, nz)).astype(np.float32)
        )
    hu = np.clip(np.rint(vol), -1024, 3071).astype(np.int16)
    return hu, lungs


def write_chest(path: Path, spec: ChestSpec) -> Path:
    """Write ``spec``'s volume (and sidecar, when it has spacing/origin) atomically."""
    hu, _ = make_chest_volume(spec.shape, spec.seed)

    buf = io.BytesIO()
    np.save(buf, hu, allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue())
    side = {
        k: list(v) for k, v in (("spacing", spec.spacing), ("origin", spec.origin)) if v is not None
    }
    if side:
        atomic_write_bytes(path.with_suffix(".json"), json.dumps(side, indent=1).encode() + b"\n")
    return path


def write_large_chest(path: Path, shape: tuple[int, int, int], seed: int, slab: int = 16) -> Path:
    """A big chest volume (e.g. 512^3, for benchmarks) written slab by slab into a .npy memory map."""
    tmp = path.with_name(f".{path.name}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int16, shape=shape)
    for a in range(0, shape[0], slab):
        out[a : a + slab] = make_chest_volume(shape, seed, rows=(a, min(shape[0], a + slab)))[0]
    out.flush()
    del out
    tmp.replace(path)
    return path


def write_formats(out: Path, specs: tuple[ChestSpec, ...] = FORMAT_VOLUMES) -> list[Path]:
    """The demo's other formats, one volume each (needs the ``ct`` extra): ``chest_004.nii.gz``, a
    DICOM series in ``dicom/chest_005/`` and ``chest_006.nrrd``, all LPS-stored axial chests with
    real geometry."""

    paths = []
    for spec, (kind, name) in zip(specs, FORMAT_FILES, strict=True):
        hu, _ = make_chest_volume(spec.shape, spec.seed)
        aff = chest_affine(spec.spacing or (1.0, 1.0, 1.0), spec.origin or (0.0, 0.0, 0.0))
        if kind == "nifti":
            paths.append(write_nifti(out / name, hu, aff))
        elif kind == "dicom":
            paths.append(write_dicom_series(out / name, hu, aff, seed=spec.seed))
        else:
            paths.append(write_nrrd(out / name, hu, aff))
    return paths


def write_ct_demo(
    root: str | Path, specs: tuple[ChestSpec, ...] = DEMO_VOLUMES, formats: bool = True
) -> list[Path]:
    """The CT demo corpus under ``root/ct`` (what data_manifests/demo_ct.toml reads): the ``.npy``
    volumes (returned) and, with ``formats``, one NIfTI, one DICOM series and one NRRD beside
    them (:func:`write_formats`), so a build of the demo exercises every reader."""
    out = Path(root) / "ct"
    paths = [write_chest(out / f"{s.stem}.npy", s) for s in specs]
    if formats:
        write_formats(out)
    return paths
