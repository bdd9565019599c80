"""The CT bench's data: the synthetic chest corpora on disk, the CT manifests, and the per-item
computation that the baselines (``per-item``, ``npz cache``) deliver, with the parity check that the
shards hold the very same points.

Split from benchmarks/ct_bench.py, which runs the figures: this module makes and checks the inputs
and times nothing (benchmarks/ct_measure.py does).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import ndimage

from pipeline.modalities.ct.demo import write_large_chest

LEVEL, WIDTH, BAND, THRESHOLD = -600.0, 1500.0, (-1000.0, -400.0), -500.0


def baseline_item(
    path: Path, body_mask: bool = True, max_points: int | None = None
) -> dict[str, np.ndarray]:
    """One volume the way a per-item CT dataset computes it (the same rule as a shardsmith record,
    and the same cap: a sorted random subset of ``max_points``)."""
    hu = np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))
    lo, hi = LEVEL - WIDTH / 2, LEVEL + WIDTH / 2
    keep = (hu >= max(lo, BAND[0])) & (hu <= min(hi, BAND[1]))
    if body_mask:
        m = hu > THRESHOLD
        lab, n = ndimage.label(m)
        if n:
            m = lab == (np.argmax(np.bincount(lab.ravel())[1:]) + 1)
        for k in range(m.shape[-1]):
            m[..., k] = ndimage.binary_fill_holes(m[..., k])
        keep &= m
    idx = np.nonzero(keep)
    kept = idx[0].size
    if max_points is not None and idx[0].size > max_points:
        sel = np.sort(np.random.default_rng(0).choice(idx[0].size, max_points, replace=False))
        idx = tuple(i[sel] for i in idx)
    vals = hu[idx]
    return {
        "coords": np.stack(idx, axis=1).astype(np.uint16),
        "hu": vals,
        "window": np.clip((vals - np.float32(lo)) / np.float32(WIDTH), 0, 1).astype(np.float16),
        "kept": np.asarray(kept, dtype=np.int64),
    }


def write_npz_cache(volumes: list[Path], out: Path, max_points: int) -> list[Path]:
    """The usual preprocessing cache: one compressed npz of the sparse result per volume."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for v in volumes:
        item = baseline_item(v, max_points=max_points)  # the same cap as the shards
        p = out / f"{v.stem}.npz"
        np.savez_compressed(p, **item)
        paths.append(p)
    return paths


def check_parity(cache: list[Path], shards: Path) -> dict[str, int]:
    """The methods must deliver the same data, or the speed ratio means nothing: per volume, the npz
    cache (the per-item computation, saved) and the shards agree on the voxels kept before the
    cap and the points stored; an uncapped volume's coordinates and features are equal.
    RuntimeError naming the volume if not."""
    from loaders.dataset import ShardDataset
    from loaders.format import read_index

    index = read_index(shards)
    recs = {r["file"]: r for rs in index.section("ct")["records"].values() for r in rs}
    got = {}
    for b in ShardDataset(
        shards, split="train", sample="ct", batch_size=1, shuffle=False, decode_process=False
    ):
        got[Path(index.sources[int(b["sample_id"][0])]["path"]).name] = (
            b["coords"][:, 1:].numpy(),
            b["feats"].numpy(),
        )
    exact = 0
    for p in cache:
        name, z = f"{p.stem}.npy", npz_item(p, with_kept=True)
        r = recs.get(name)
        if r is None or name not in got:
            raise RuntimeError(f"parity: {name} is in the npz cache but not in the shards")
        if (
            int(z["kept"]) != int(r["kept"])
            or z["coords"].shape[0] != int(r["points"])
            or got[name][0].shape[0] != int(r["points"])
        ):
            raise RuntimeError(
                f"parity: {name}: per-item keeps {int(z['kept'])} voxels, stores {len(z['coords'])}; "
                f"shards {r['kept']}, {r['points']}"
            )
        if int(r["kept"]) == int(r["points"]):  # no cap drawn: the very same points
            feats = np.stack([z["hu"].astype(np.float32), z["window"].astype(np.float32)], axis=1)
            if not (
                np.array_equal(got[name][0], z["coords"]) and np.array_equal(got[name][1], feats)
            ):
                raise RuntimeError(f"parity: {name}: shards and per-item give different points")
            exact += 1
    return {"volumes": len(cache), "compared_exactly": exact}


def npz_item(path: Path, with_kept: bool = False) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in ("coords", "hu", "window", *(("kept",) if with_kept else ()))}


def corpus(data_dir: Path, shape: tuple[int, int, int], n: int) -> list[Path]:
    d = data_dir / f"ct_{'x'.join(map(str, shape))}_{n}"
    paths = [d / f"chest_{i:03d}.npy" for i in range(n)]
    for i, p in enumerate(paths):
        if not p.exists():
            write_large_chest(p, shape, 100 + i)
    return paths


def write_manifest(
    path: Path,
    volumes_glob: str,
    name: str,
    fmt: str,
    max_points: int,
    seed: int,
    shard_size_mb: float = 64,
) -> Path:
    path.write_text(f"""[dataset]
name = "{name}"
kind = "ct"
format = "{fmt}"
seed = {seed}
shard_size_mb = {shard_size_mb}

[[sources]]
path = "{volumes_glob}"
type = "npy"

[ct]
max_points = {max_points}

[split]
val_fraction = 0.0
test_fraction = 0.0
""")
    return path
