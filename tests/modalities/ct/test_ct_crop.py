"""The CT crop by search (loaders.modalities.ct.crop) selects exactly the points of the brute-force
test the loader used before it, for the same seeded draws."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.modalities.ct import crop as ct_crop
from loaders.modalities.ct import ops as ct_ops
from pipeline.modalities.ct.demo import make_chest_volume

SETTINGS = settings(max_examples=150, deadline=None)


def reference_crop_rows(
    xyz: np.ndarray, offsets: np.ndarray, aug: ct_ops.Augment
) -> tuple[np.ndarray, np.ndarray]:
    """The crop as the loader computed it before the search (int64 copy of every coordinate, one
    compare per point and axis): the reference the fast crop must equal."""
    b = ct_ops.batch_column(offsets)
    rel = xyz.astype(np.int64) - aug.origin[b]
    keep = np.all((rel >= 0) & (rel < aug.extent[b]), axis=1)
    counts = np.bincount(b[keep], minlength=aug.origin.shape[0])
    off = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return keep, off


def blob_volume(shape: tuple[int, int, int], seed: int, keep: float) -> np.ndarray:
    """Argwhere-ordered uint16 coordinates of a lung-like volume: two ellipsoids (long runs along
    z and y, as real lungs give), thinned at random (a capped record: a sorted random subset)."""
    rng = np.random.default_rng(seed)
    g = [(np.arange(n, dtype=np.float64) + 0.5) / n for n in shape]
    x, y, z = g[0][:, None, None], g[1][None, :, None], g[2][None, None, :]
    m = np.zeros(shape, dtype=bool)
    for side in (-1.0, 1.0):
        cx, r = 0.5 + side * rng.uniform(0.1, 0.25), rng.uniform(0.15, 0.3, size=3)
        m |= ((x - cx) / r[0]) ** 2 + ((y - 0.5) / r[1]) ** 2 + ((z - 0.5) / r[2]) ** 2 <= 1
    m &= rng.random(shape) < keep
    return np.argwhere(m).astype(np.uint16)


@st.composite
def volumes(draw: st.DrawFn) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Samples of a batch: small shapes (edges, single rows, empty volumes), dense or sparse."""
    b = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    shapes = rng.integers(1, 40, size=(b, 3))
    out = []
    for s in shapes:
        kind = draw(st.sampled_from(["blob", "random", "full", "empty"]))
        if kind == "blob":
            out.append(blob_volume(tuple(int(v) for v in s), int(rng.integers(1 << 30)), 0.8))
        elif kind == "empty":
            out.append(np.zeros((0, 3), np.uint16))
        else:
            n = int(np.prod(s)) if kind == "full" else int(rng.integers(0, 200))
            flat = np.arange(n) if kind == "full" else np.unique(rng.integers(0, np.prod(s), n))
            out.append(np.stack(np.unravel_index(flat, tuple(s)), axis=1).astype(np.uint16))
    return out, shapes, rng.choice(10_000, size=b, replace=False)


def concat(xyz: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    off = np.zeros(len(xyz) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in xyz], out=off[1:])
    return np.ascontiguousarray(np.concatenate(xyz)), off


@SETTINGS
@given(
    batch=volumes(),
    crop=st.tuples(*[st.integers(1, 45)] * 3),
    seed=st.integers(0, 99),
    epoch=st.integers(0, 3),
)
def test_crop_selects_exactly_the_brute_force_points(
    batch: tuple, crop: tuple, seed: int, epoch: int
) -> None:
    xyz, shapes, ids = batch
    aug = ct_ops.draw_augment(shapes, ids, seed, epoch, crop, (True, True, True))
    cat, off = concat(xyz)
    want, want_off = reference_crop_rows(cat, off, aug)
    keep, new_off = ct_ops.crop_rows(cat, off, aug)
    np.testing.assert_array_equal(keep, want)
    np.testing.assert_array_equal(new_off, want_off)
    for i, v in enumerate(xyz):  # per volume, as the sample type calls it
        a, k = ct_crop.crop_span(v, aug.origin[i], aug.extent[i])
        mine = want[off[i] : off[i + 1]]
        np.testing.assert_array_equal(a + np.flatnonzero(k), np.flatnonzero(mine))
        np.testing.assert_array_equal(ct_crop.take_rows(v[a : a + k.size], k), v[mine])


def test_lung_sized_volume_every_draw_exact() -> None:
    """A 2-lung volume of realistic extent (fewer slices, to stay quick) under the loader's crop:
    200 draws, each the same points, rows and offsets as the reference; contiguous or not."""
    v = blob_volume((256, 256, 24), seed=5, keep=1.0)
    assert v.shape[0] > 100_000
    shapes = np.array([[256, 256, 24]])
    for sid in range(200):
        aug = ct_ops.draw_augment(shapes, np.array([sid]), 1, 0, (128, 128, 16), (True,) * 3)
        want, _ = reference_crop_rows(v, np.array([0, v.shape[0]]), aug)
        a, k = ct_crop.crop_span(v, aug.origin[0], aug.extent[0])
        np.testing.assert_array_equal(a + np.flatnonzero(k), np.flatnonzero(want))
        np.testing.assert_array_equal(ct_crop.take_rows(v[a : a + k.size], k), v[want])
    strided = np.asfortranarray(v)  # np.argwhere's own layout: the row-indexing fallback
    np.testing.assert_array_equal(ct_crop.take_rows(strided[a : a + k.size], k), v[want])


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 300),
    stride=st.sampled_from([1, 2, 3, 32, 64]),
    seed=st.integers(0, 2**31),
    top=st.sampled_from([5, 65536]),
)
def test_first_at_least_is_searchsorted_of_the_keys(
    n: int, stride: int, seed: int, top: int
) -> None:
    """The sampled search equals ``searchsorted`` of the full (x, y) key column, keys beyond both
    ends and at the uint16 limit included."""
    rng = np.random.default_rng(seed)
    xy = np.sort(rng.integers(max(0, top - 8), top, size=n) * 65536 + rng.integers(0, top, n))
    xyz = np.zeros((n, 3), np.uint16)
    xyz[:, 0], xyz[:, 1] = xy // 65536, xy % 65536
    keys = np.concatenate([rng.integers(0, top * 65536 + 1, 40), [0, top * 65536]])
    want = np.searchsorted(xy, keys)
    np.testing.assert_array_equal(ct_crop.first_at_least(xyz, keys, stride), want)


def test_loader_serves_the_brute_force_crop(tmp_path: Path, ct_npy: Any) -> None:
    """End to end: the sample type's per-volume crop (coordinates and features) equals the brute
    force applied to the uncropped batches, for the same draws, flips on, several epochs."""
    from loaders import ShardDataset  # torch, only for the test that loads

    (tmp_path / "vols").mkdir()
    for i in range(3):
        np.save(tmp_path / "vols" / f"c{i}.npy", make_chest_volume((40, 36, 20), 7 + i)[0])
    np.save(tmp_path / "vols" / "air.npy", np.full((8, 8, 4), -1000, np.int16))  # no points
    root = ct_npy.make(tmp_path)
    kw: dict[str, Any] = dict(sample="ct", batch_size=2, shuffle=False, seed=4)
    whole = {
        int(s): (b["coords"][b["coords"][:, 0] == i, 1:].numpy(), b["feats"].numpy(), b)
        for b in ShardDataset(root, **kw)
        for i, s in enumerate(b["sample_id"].tolist())
    }
    for epoch in range(3):
        ds = ShardDataset(root, **kw, crop=(20, 18, 8), flip=True)
        ds.set_epoch(epoch)
        for b in ds:
            off, sid = b["offsets"].numpy(), b["sample_id"].numpy()
            shapes = np.stack([whole[int(s)][2]["shape"][0].numpy() for s in sid])
            aug = ct_ops.draw_augment(shapes, sid, 4, epoch, (20, 18, 8), (True,) * 3)
            for i, s in enumerate(sid.tolist()):
                xyz, _, wb = whole[s]
                j = wb["sample_id"].tolist().index(s)
                feats = wb["feats"].numpy()[wb["offsets"][j] : wb["offsets"][j + 1]]
                rel = xyz.astype(np.int64) - aug.origin[i]
                inside = np.all((rel >= 0) & (rel < aug.extent[i]), axis=1)
                want = np.where(aug.flip[i], aug.extent[i] - 1 - rel[inside], rel[inside])
                rows = slice(off[i], off[i + 1])
                np.testing.assert_array_equal(b["coords"][rows, 1:].numpy(), want)
                np.testing.assert_array_equal(b["feats"][rows].numpy(), feats[inside])


def test_crop_at_the_uint16_limit() -> None:
    """Coordinates up to 65535 and a sub-cube reaching 65536 (the largest grid uint16 indexes)."""
    v = np.array([[0, 0, 0], [0, 0, 65535], [1, 65535, 3], [65535, 2, 65534]], dtype=np.uint16)
    for origin, extent in [
        ((0, 0, 0), (2, 65536, 65536)),
        ((0, 0, 65534), (65536, 3, 2)),
        ((1, 2, 3), (65535, 65534, 65533)),
    ]:
        aug = ct_ops.Augment(np.array([origin]), np.array([extent]), np.zeros((1, 3), bool))
        want, _ = reference_crop_rows(v, np.array([0, 4]), aug)
        a, k = ct_crop.crop_span(v, origin, extent)
        np.testing.assert_array_equal(a + np.flatnonzero(k), np.flatnonzero(want))


def test_out_of_order_points_are_refused_where_a_crop_relies_on_them() -> None:
    """The crop's search assumes argwhere order: a record written in another order is named by
    the loader's check (cropping only, once per shard) and by `shardsmith verify`'s kind check."""
    from loaders.format import FormatError
    from loaders.samples import get_sample_type
    from pipeline.model import KINDS

    xyz = blob_volume((12, 10, 6), 3, 0.8)
    off = np.array([0, 5, xyz.shape[0]], dtype=np.int64)
    assert ct_crop.first_unordered(xyz, off) is None
    swapped = xyz.copy()
    swapped[[7, 8]] = swapped[[8, 7]]
    assert ct_crop.first_unordered(swapped, off) == 1
    assert ct_crop.first_unordered(np.concatenate([xyz[:5], xyz[:5]]), np.array([0, 5, 10])) is None
    cols = {"coords/values": swapped, "coords/offsets": off}
    get_sample_type("ct").check_columns(cols, "s.zarr")  # no crop: order does not matter
    cropping = get_sample_type("ct", crop=4)
    with pytest.raises(FormatError, match="s.zarr: CT record 1's coordinates are not in argwhere"):
        cropping.check_columns(cols, "s.zarr")
    cropping.check_columns({**cols, "coords/values": xyz}, "t.zarr")
    shapes = np.array([[12, 10, 6], [12, 10, 6]], dtype=np.int64)
    kind_cols = {**cols, "volume_shape": shapes}
    problems = KINDS.get("ct").check_shard(None, kind_cols)
    assert any("record 1's coordinates are not in argwhere order" in p for p in problems)
    assert not KINDS.get("ct").check_shard(None, {**kind_cols, "coords/values": xyz})
