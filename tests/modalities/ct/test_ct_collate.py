"""Collation and coordinate augmentation of sparse-voxel batches (loaders.modalities.ct.ops)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.modalities.ct import ops as ct_ops

SETTINGS = settings(max_examples=80, deadline=None)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Per-sample coordinate arrays (argwhere-ordered, inside their volume's shape) and shapes."""
    b = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    shapes = rng.integers(1, 12, size=(b, 3))
    xyz = []
    for s in shapes:
        n = int(rng.integers(0, 30))
        flat = np.unique(rng.integers(0, int(np.prod(s)), size=n))
        xyz.append(np.stack(np.unravel_index(flat, tuple(s)), axis=1).astype(np.uint16))
    ids = rng.choice(1000, size=b, replace=False)
    return xyz, shapes, ids


def collated(
    xyz: list[np.ndarray], batch_dim: str = "first"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    off = np.zeros(len(xyz) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in xyz], out=off[1:])
    cat = np.concatenate(xyz) if xyz else np.zeros((0, 3), np.uint16)
    hu = np.arange(cat.shape[0], dtype=np.int16)  # a feature that identifies its row
    return ct_ops.collate(cat, off, [hu, hu.astype(np.float16) / 7], batch_dim)


@SETTINGS
@given(batch=batches(), last=st.booleans())
def test_collate_layout(batch: tuple, last: bool) -> None:
    xyz, _, _ = batch
    coords, feats, off = collated(xyz, "last" if last else "first")
    bcol, cols = (3, slice(0, 3)) if last else (0, slice(1, 4))
    assert coords.dtype == np.int32 and coords.shape == (off[-1], 4)
    assert feats.dtype == np.float32 and feats.shape == (off[-1], 2)
    assert off[0] == 0 and np.all(np.diff(off) == [len(a) for a in xyz])
    assert np.all(
        np.diff(coords[:, bcol]) >= 0
    )  # rows of a sample contiguous, samples in batch order
    for i, a in enumerate(xyz):
        rows = coords[off[i] : off[i + 1]]
        assert np.all(rows[:, bcol] == i)
        np.testing.assert_array_equal(rows[:, cols], a)
    np.testing.assert_array_equal(feats[:, 0], np.arange(off[-1]))


def augmented(
    xyz: list[np.ndarray], aug: ct_ops.Augment, bd: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the sample type does: crop on the host, then the ct_coords op (numpy finisher)."""
    cat = np.concatenate(xyz)
    off = np.zeros(len(xyz) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in xyz], out=off[1:])
    keep, new_off = ct_ops.crop_rows(cat, off, aug)
    d = ct_ops.CtCoords(cat[keep], new_off, aug.origin, aug.extent, aug.flip, bd)
    return d.finish(), keep, new_off


@SETTINGS
@given(
    batch=batches(),
    crop=st.one_of(st.none(), st.tuples(*[st.integers(1, 8)] * 3)),
    flip=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    seed=st.integers(0, 99),
    epoch=st.integers(0, 3),
    last=st.booleans(),
)
def test_augment_matches_brute_force_and_torch(
    batch: tuple, crop: tuple | None, flip: tuple, seed: int, epoch: int, last: bool
) -> None:
    torch = pytest.importorskip("torch")
    from loaders.engine.device import finish

    xyz, shapes, ids = batch
    bd = "last" if last else "first"
    aug = ct_ops.draw_augment(shapes, ids, seed, epoch, crop, flip)
    got, keep, off = augmented(xyz, aug, bd)
    bcol, cols = (3, slice(0, 3)) if last else (0, slice(1, 4))
    assert got.dtype == np.int32 and got.shape == (off[-1], 4)
    first = 0
    for i, a in enumerate(xyz):  # brute force, one sample at a time
        o, e, fl = aug.origin[i], aug.extent[i], aug.flip[i]
        assert np.all(o >= 0) and np.all(o + e <= shapes[i])
        assert np.all(e == (shapes[i] if crop is None else np.minimum(shapes[i], crop)))
        assert not np.any(fl & ~np.asarray(flip))
        rel = a.astype(np.int64) - o
        inside = np.all((rel >= 0) & (rel < e), axis=1)
        np.testing.assert_array_equal(keep[first : first + len(a)], inside)
        first += len(a)
        expect = np.where(fl, e - 1 - rel[inside], rel[inside])
        rows = got[off[i] : off[i + 1]]
        np.testing.assert_array_equal(rows[:, cols], expect)
        assert np.all(rows[:, bcol] == i)
        assert np.all((rows[:, cols] >= 0) & (rows[:, cols] < e))
    d = ct_ops.CtCoords(np.concatenate(xyz)[keep], off, aug.origin, aug.extent, aug.flip, bd)
    parts = {k: torch.from_numpy(v) for k, v in d.parts().items()}
    from loaders.modalities.ct import torch_ops as ct_torch

    np.testing.assert_array_equal(ct_torch.finish_coords_torch(parts, d.meta()).numpy(), got)
    np.testing.assert_array_equal(
        finish(d.op, parts, d.meta()).numpy(), got
    )  # the device layer's path (CPU)
    out = np.zeros(got.size, np.int32)  # the worker path writes into a flat shared buffer
    d.finish(out)
    np.testing.assert_array_equal(out.reshape(-1, 4), got)


@SETTINGS
@given(batch=batches(), seed=st.integers(0, 99))
def test_flip_twice_is_identity_and_draws_do_not_depend_on_the_batch(
    batch: tuple, seed: int
) -> None:
    xyz, shapes, ids = batch
    aug = ct_ops.draw_augment(shapes, ids, seed, 1, None, (True, True, True))
    once, _, off = augmented(xyz, aug, "first")
    twice = ct_ops.finish_coords(once[:, 1:], off, np.zeros_like(aug.origin), aug.extent, aug.flip)
    np.testing.assert_array_equal(twice, collated(xyz)[0])
    alone = ct_ops.draw_augment(shapes[-1:], ids[-1:], seed, 1, (3, 3, 3), (True, False, True))
    together = ct_ops.draw_augment(shapes, ids, seed, 1, (3, 3, 3), (True, False, True))
    np.testing.assert_array_equal(alone.origin[0], together.origin[-1])
    np.testing.assert_array_equal(alone.flip[0], together.flip[-1])
    again = ct_ops.draw_augment(shapes, ids, seed, 2, (3, 3, 3), (True, True, True))
    assert (
        again.origin.shape == together.origin.shape
    )  # other epochs draw afresh (not asserted unequal: tiny shapes)


def test_bad_collate_arguments() -> None:
    with pytest.raises(ValueError, match="batch_dim"):
        ct_ops.collate(np.zeros((0, 3)), np.array([0]), batch_dim="middle")
    with pytest.raises(ValueError, match=r"offsets say \[2, 3\]"):
        ct_ops.collate(np.zeros((3, 3)), np.array([0, 2]))
