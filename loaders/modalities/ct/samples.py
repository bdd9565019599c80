"""Sample type ``ct``: one CT volume's sparse voxels per unit, collated TRELLIS / spconv /
MinkowskiEngine-style.

A batch (``ShardDataset(root, sample="ct", ...)``) holds

* ``coords`` int32 ``[N, 4]``: (batch index, x, y, z), each volume's rows contiguous and in stored
  (``np.argwhere``) order (torchsparse >= 2.1 takes this too); ``batch_dim="last"`` gives
  torchsparse < 2.1's (x, y, z, batch index). x, y, z index the
  stored volume's axes 0, 1, 2 (the ``.npy``'s, or the reader's for NIfTI/NRRD/DICOM, or
  RAS/LPS with ``[ct] orientation``) (after the optional crop: relative to the sub-cube; after a
  flip: mirrored);
* ``feats`` float32 ``[N, C]``: the stored features in ``features`` order (``hu``: Hounsfield units;
  ``window``: the windowed value in [0, 1]);
* ``offsets`` int64 ``[B + 1]``: volume ``i`` is rows ``offsets[i]:offsets[i+1]``;
* ``sample_id`` int64 ``[B]``: the volume's position among the manifest's sources (sorted glob
order), i.e.
  ``index.sources[sample_id]["path"]``; ``shape`` int32 ``[B, 3]``: the grid each volume's
  coordinates live in
  (the crop's extent when cropping).

With ``geometry=True`` a batch also holds ``affine`` float64 ``[B, 4, 4]`` (the served
coordinates, after crop and flips, to RAS millimetres, from the geometry ``index.json`` keeps per
record; NaN where the source had no spacing) and ``spacing`` float64 ``[B, 3]`` (mm per served
axis).

Options: ``batch_dim`` ("first" | "last"), ``crop`` (x, y, z sub-cube size: a seeded random
sub-cube per volume and epoch), ``flip`` (bool, or three bools per axis: seeded random mirror),
``features`` (a subset or order of the stored ones), ``geometry``, ``max_points_per_batch``
(batch by voxel budget instead of ``batch_size``: as many volumes as fit, planned from the
per-record point counts in ``index.json``; see :mod:`loaders.epoch.budget`).

The coordinate collation is the deferred op ``ct_coords`` (:mod:`loaders.modalities.ct.ops`): on
a CUDA loader it runs on the GPU after shipping uint16 coordinates; the crop runs here, on the
host, so cropped-away points never cross. The column names below are the contract with the
pipeline's kind ``ct`` (pipeline/modalities/ct/kind.py imports them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from loaders.format import SAMPLE_ID, FormatError, Index
from loaders.modalities.ct.crop import crop_span, first_unordered, take_rows
from loaders.modalities.ct.ops import BATCH_DIMS, CtCoords, draw_augment
from loaders.samples import SampleType, register_sample_type
from loaders.samples.payload import Payload

if TYPE_CHECKING:
    from loaders.format.values import ShardEntry
    from loaders.samples.gather import BatchRows

KIND = "ct"
COORDS = "coords"  # ragged uint16 [k, 3]: voxel indices of a volume's kept points, argwhere order
SHAPE = "volume_shape"  # dense int32 [3]: the grid the coordinates index (after resampling)
FEATURES = {"hu": "int16", "window": "float16"}  # ragged [k] beside coords: name -> dtype
RECORDS = (
    "records"  # index.json sections["ct"]["records"][shard file]: per-record metadata, shard order
)
POINTS = "points"  # the key of a record's point count in that metadata


def _triple(name: str, v: Any, kind: type) -> tuple[Any, Any, Any]:
    """``v`` as (x, y, z): one value for every axis, or three. ``kind`` is int or bool (never both)."""

    def ok(x: Any) -> bool:
        return (
            isinstance(x, bool) if kind is bool else isinstance(x, int) and not isinstance(x, bool)
        )

    if ok(v):
        return (v, v, v)
    if isinstance(v, Sequence) and not isinstance(v, str) and len(v) == 3 and all(ok(x) for x in v):
        return (v[0], v[1], v[2])
    raise ValueError(
        f"sample 'ct': {name} must be one {kind.__name__} or three (x, y, z), got {v!r}"
    )


@register_sample_type
class CtVolumes(SampleType):
    name = KIND

    def __init__(
        self,
        batch_dim: str = "first",
        crop: int | Sequence[int] | None = None,
        flip: bool | Sequence[bool] = False,
        features: Sequence[str] | None = None,
        max_points_per_batch: int | None = None,
        geometry: bool = False,
        **rest: Any,
    ) -> None:
        super().__init__(**rest)
        self.geometry = bool(geometry)
        self._affine: dict[int, np.ndarray] = {}
        if batch_dim not in BATCH_DIMS:
            raise ValueError(
                f"sample 'ct': batch_dim must be one of {BATCH_DIMS}, got {batch_dim!r}"
            )
        self.batch_dim = batch_dim
        self.crop = None if crop is None else tuple(int(c) for c in _triple("crop", crop, int))
        if self.crop is not None and min(self.crop) < 1:
            raise ValueError(f"sample 'ct': crop sizes must be >= 1, got {list(self.crop)}")
        self.flip = tuple(bool(f) for f in _triple("flip", flip, bool))
        if features is not None and (
            isinstance(features, str)
            or any(f not in FEATURES for f in features)
            or len(set(features)) != len(features)
        ):
            raise ValueError(
                f"sample 'ct': features must be distinct names among {list(FEATURES)}, got {features!r}"
            )
        self.features = None if features is None else tuple(features)
        if max_points_per_batch is not None and (
            isinstance(max_points_per_batch, bool) or int(max_points_per_batch) < 1
        ):
            raise ValueError(
                f"sample 'ct': max_points_per_batch must be >= 1, got {max_points_per_batch!r}"
            )
        self.budget = None if max_points_per_batch is None else int(max_points_per_batch)
        self._feats: tuple[str, ...] = self.features or ()
        self._points: dict[str, np.ndarray] = {}
        self._ordered: set[str] = set()  # shards whose point order this process checked

    def options(self) -> dict[str, Any]:
        return {
            "batch_dim": self.batch_dim,
            "crop": None if self.crop is None else list(self.crop),
            "flip": list(self.flip),
            "features": None if self.features is None else list(self.features),
            "max_points_per_batch": self.budget,
            "geometry": self.geometry,
        }

    # -- the dataset
    # --------------------------------------------------------------------------------
    def fields(self, index: Index) -> list[str]:
        return [SAMPLE_ID, COORDS, SHAPE, *self._stored(index)]

    def _stored(self, index: Index) -> tuple[str, ...]:
        have = tuple(f for f in FEATURES if index.has_field(f))
        if self.features is None:
            return have
        missing = [f for f in self.features if f not in have]
        if missing:
            raise ValueError(
                f"sample 'ct': {index.root} stores features {list(have)}, not {missing}"
            )
        return self.features

    def check(self, index: Index) -> None:
        self._stored(index)
        super().check(index)

    def bind(self, index: Index) -> None:
        self._feats = self._stored(index)
        records = index.section(KIND).get(RECORDS) or {}
        self._points = {
            str(f): np.asarray([int(r[POINTS]) for r in rs], np.int64) for f, rs in records.items()
        }
        if self.geometry:
            self._affine = {}
            for r in (r for rs in records.values() for r in rs):
                if "sample_id" not in r:
                    raise ValueError(
                        f"sample 'ct': {index.root} was built before records kept "
                        "their sample_id: rebuild it to get geometry=True"
                    )
                self._affine[int(r["sample_id"])] = record_affine(r)
        if self.budget is not None:
            biggest = max((int(p.max()) for p in self._points.values() if p.size), default=0)
            if biggest > self.budget:
                raise ValueError(
                    f"sample 'ct': max_points_per_batch={self.budget} is below the largest volume of "
                    f"{index.root} ({biggest} points): raise it, or rebuild with [ct] max_points <= it"
                )

    def unit_costs(self, entries: Sequence[ShardEntry]) -> list[np.ndarray]:
        """Points of every unit of these shards, from ``index.json`` alone (budget batching plans
        with them)."""
        out = []
        for e in entries:
            p = self._points.get(e.file)
            if p is None or p.size != e.units_of(self.name):
                raise FormatError(
                    f"{e.file}: index.json lists {None if p is None else p.size} CT record point "
                    f"counts for {e.units_of(self.name)} volumes (sections.ct.records)"
                )
            out.append(p)
        return out

    # -- a shard
    # ------------------------------------------------------------------------------------
    def check_columns(self, columns: Mapping[str, np.ndarray], name: str) -> None:
        """A cropping loader relies on argwhere order (:func:`first_unordered`): checked once per
        shard and process (~6 ms for 2M points), not on every epoch's decode."""
        if self.crop is None or name in self._ordered:
            return
        bad = first_unordered(columns[f"{COORDS}/values"], columns[f"{COORDS}/offsets"])
        if bad is not None:
            raise FormatError(
                f"{name}: CT record {bad}'s coordinates are not in argwhere order (x, then y, then "
                "z increasing), which crop= relies on: rebuild the dataset with shardsmith"
            )
        self._ordered.add(name)

    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.arange(columns[SAMPLE_ID].shape[0], dtype=np.int64)[:, None]

    # -- a batch
    # ------------------------------------------------------------------------------------
    def assemble(self, batch: BatchRows) -> Payload:

        rows = batch.rows(0)
        sample_id = rows.take(SAMPLE_ID)
        shapes = rows.take(SHAPE).astype(np.int64)
        aug = draw_augment(shapes, sample_id, batch.seed, batch.epoch, self.crop, self.flip)
        parts = _ragged_parts(batch, COORDS)
        spans: list[tuple[int, np.ndarray]] | None = None
        if self.crop is not None:  # per volume, on the stored rows: only kept points are copied
            spans = [crop_span(p, aug.origin[i], aug.extent[i]) for i, p in enumerate(parts)]
            parts = [
                take_rows(p[a : a + k.size], k) for p, (a, k) in zip(parts, spans, strict=True)
            ]
        off = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([p.shape[0] for p in parts], out=off[1:])
        xyz = np.concatenate(parts) if parts else np.zeros((0, 3), np.uint16)
        feats = np.empty((xyz.shape[0], len(self._feats)), dtype=np.float32)
        for c, name in enumerate(self._feats):
            for i, p in enumerate(_ragged_parts(batch, name)):
                if spans is not None:
                    a, k = spans[i]
                    p = p[a : a + k.size][k]
                feats[off[i] : off[i + 1], c] = p
        arrays = {
            "feats": feats,
            "offsets": off,
            "sample_id": sample_id,
            "shape": aug.extent.astype(np.int32),
        }
        if self.geometry:
            stored = np.zeros((0, 4, 4))
            if len(sample_id):
                stored = np.stack([self._affine[int(i)] for i in sample_id])
            arrays["affine"] = served_affine(stored, aug.origin, aug.extent, aug.flip)
            arrays["spacing"] = np.linalg.norm(arrays["affine"][:, :3, :3], axis=1)
        return Payload(
            arrays=arrays,
            xs={"coords": CtCoords(xyz, off, aug.origin, aug.extent, aug.flip, self.batch_dim)},
        )


def record_affine(r: Mapping[str, Any]) -> np.ndarray:
    """float64 4x4 index -> RAS mm of a stored record (``index.json``): NaN without a spacing; a
    ``.npy`` sidecar's spacing/origin are taken along the array axes (direction identity, origin 0
    when absent)."""
    if r.get("spacing") is None:
        return np.full((4, 4), np.nan)
    a = np.eye(4)
    d = np.eye(3) if r.get("direction") is None else np.asarray(r["direction"], np.float64)
    a[:3, :3] = d * np.asarray(r["spacing"], np.float64)
    a[:3, 3] = 0.0 if r.get("origin") is None else np.asarray(r["origin"], np.float64)
    return a


def served_affine(
    stored: np.ndarray, origin: np.ndarray, extent: np.ndarray, flip: np.ndarray
) -> np.ndarray:
    """``[B, 4, 4]``: each volume's affine for the coordinates as served, after its crop (shift by
    the sub-cube's origin) and flips (``c -> extent - 1 - c``): ``world = A @ (x, y, z, 1)``."""
    b = stored.shape[0]
    m = np.zeros((b, 4, 4))
    sign = np.where(flip, -1.0, 1.0)
    m[:, [0, 1, 2], [0, 1, 2]] = sign
    m[:, :3, 3] = origin + np.where(flip, extent - 1, 0)
    m[:, 3, 3] = 1.0
    return stored @ m


def _ragged_parts(batch: BatchRows, name: str) -> list[np.ndarray]:
    """Each unit's list of ragged field ``name`` as a view into its arena, in batch order.

    A CT batch is a few volumes of 1e5-1e6 points each: slicing per volume and one concatenate is
    a single memcpy, where the generic row gather (``Rows.ragged``) builds an int64 index per
    point (3x slower here)."""
    units = batch.units[:, 0]
    out = []
    for i in range(units.size):
        arena = batch.arenas[0 if batch.group is None else int(batch.group[i])]
        ptr, values = arena.columns[f"{name}/offsets"], arena.columns[f"{name}/values"]
        r = int(units[i])
        out.append(values[int(ptr[r]) : int(ptr[r + 1])])
    return out
