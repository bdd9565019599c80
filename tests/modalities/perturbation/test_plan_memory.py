"""The plan's compact paths give what the straightforward ones give: the condition table counted in
a presence table equals np.unique's (rows, order and inverse)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pipeline.modalities.perturbation.conditions as conditions
from loaders import format as fmt
from pipeline import parking


@pytest.mark.parametrize("sizes", [(7, 3, 5), (1,), (300, 2, 9, 4)])
def test_distinct_rows_dense_equals_the_sort(
    sizes: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(len(sizes))
    cols = [rng.integers(0, s, 5000).astype(np.int32) for s in sizes]
    inverse, table = conditions.distinct_rows(cols)
    monkeypatch.setattr(conditions, "DENSE_KEYS", 0)  # force the np.unique path
    inverse_sorted, table_sorted = conditions.distinct_rows(cols)
    assert np.array_equal(table, table_sorted) and np.array_equal(inverse, inverse_sorted)
    assert inverse.dtype == np.int32 and table.dtype == np.int32
    assert np.array_equal(table[inverse], np.stack(cols, axis=1))


def test_the_plan_holds_a_few_compact_bytes_per_cell(
    tmp_path: Path, write_manifest: Callable[..., Any]
) -> None:
    """What planning holds for every cell of the dataset at once (its peak at millions of cells) is
    kept in the smallest types, and the barcodes are not kept at all; the planned shard columns
    are unchanged: int32 codes and condition ids, int64 sample ids (row + the rows of the sources
    before), the source's barcodes of the shard's rows."""
    import anndata as ad

    from pipeline.manifest import load_manifest
    from pipeline.modalities.perturbation.demo import write_perturb_h5ad
    from pipeline.modalities.perturbation.plan import make_plan
    from pipeline.modalities.perturbation.scan import scan

    (tmp_path / "src").mkdir()
    paths = [tmp_path / "src" / f"s{i}.h5ad" for i in range(2)]
    for i, p in enumerate(paths):
        write_perturb_h5ad(p, n_cells=300 + 50 * i, n_genes=40, n_perts=6, seed=i)
    manifest = load_manifest(write_manifest(tmp_path / "m.toml"))
    scanned = scan(manifest)
    for s in scanned:
        assert s.has_obs_names and s.meta.obs_names is None and not s.meta.obs
        assert s.meta.row_nnz.itemsize == 4 and all(c.codes.itemsize == 1 for c in s.obs.values())
    plan = make_plan(manifest, scanned)
    cells = plan.cells
    held = (
        cells.source,
        cells.row,
        cells.is_control,
        plan.conditions.cond_id,
        *cells.codes.values(),
    )
    assert sum(a.nbytes for a in held) / len(cells) <= 12  # int32/int64 columns: 41 bytes a cell
    offsets = np.cumsum([0] + [s.meta.n_rows for s in scanned])
    names = [np.asarray(ad.read_h5ad(p, backed="r").obs_names) for p in paths]
    off_key, val_key = fmt.ragged_keys(fmt.OBS_NAMES)
    for sh in plan.shards:
        c = sh.columns
        assert c[fmt.SAMPLE_ID].dtype == np.int64
        assert np.array_equal(c[fmt.SAMPLE_ID], sh.rows + offsets[sh.source])
        assert c[fmt.COND_ID].dtype == np.int32
        assert all(
            c[fmt.OBS_PREFIX + f].dtype == np.int32 for f in manifest.config.fields.obs_fields
        )
        got = [
            bytes(c[val_key][a:b]).decode()
            for a, b in zip(c[off_key][:-1], c[off_key][1:], strict=True)
        ]
        assert got == names[sh.source][sh.rows].tolist()


def test_condition_vectors_are_made_after_the_plan_and_equal_the_blocks(tmp_path: Path) -> None:
    """The vectors (conditions x dimensions, growing with the dataset) are not held while sources
    are planned: made on first use, in place, equal to the per-field blocks concatenated
    (one-hot, features, numeric)."""
    codes = {
        "perturbation": np.array([0, 1, 2, 2, 1], np.int8),
        "cell_type": np.array([1, 0, 1, 1, 0], np.int8),
        "dose": np.array([0, 1, 1, 0, 1], np.int8),
    }
    vocab = {"perturbation": ["a", "b", "ctrl"], "cell_type": ["x", "y"], "dose": ["1", "10"]}
    feats = (
        np.arange(9, dtype=np.float64).reshape(3, 3) / 7
    )  # float64 features: cast like the concatenation
    opts = conditions.VectorOptions(numeric=("dose",))
    t = conditions.build_conditions(
        codes, ["perturbation", "cell_type", "dose"], vocab, feats, opts
    )
    assert "vectors" not in t.__dict__  # not made yet
    onehot = np.eye(2, dtype=np.float32)[t.codes[:, 1]]
    dose = conditions.numeric_values("dose", vocab["dose"], opts)[t.codes[:, 2]]
    want = np.concatenate([feats[t.codes[:, 0]], onehot, dose], axis=1).astype(np.float32)
    assert t.vectors.dtype == np.float32 and np.array_equal(t.vectors, want)
    assert [s["offset"] for s in t.segments] == [0, 3, 5] and [s["size"] for s in t.segments] == [
        3,
        2,
        1,
    ]


def test_every_pack_task_hands_its_freed_memory_back(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    """Read, pack and fused tasks each end with a heap trim (pipeline.memory.trim_heap): freed
    blocks otherwise stay resident, and the build's RSS crept up with the number of tasks it ran."""
    import pipeline.modalities.perturbation.pack
    import pipeline.modalities.perturbation.routing
    from pipeline.build import build
    from pipeline.events import EventLog

    build_dataset(tmp_path, "sources", sources=2, cells=300)
    manifest = write_manifest(tmp_path / "m.toml")
    trims: list[str] = []
    for module in (pipeline.modalities.perturbation.pack, pipeline.modalities.perturbation.routing):
        monkeypatch.setattr(
            module, "trim_heap", lambda: trims.append(sys._getframe(1).f_code.co_name)
        )
    for fuse, out in ((1 << 30, "fused"), (0, "spilled")):
        monkeypatch.setattr(pipeline.modalities.perturbation.pack, "FUSE_BYTES", fuse)
        monkeypatch.setattr(pipeline.modalities.perturbation.pack, "SCATTER_BYTES", 40_000)
        monkeypatch.setattr(parking, "PARK_BYTES", 0)  # spill files, not the memory park
        trims.clear()
        ev = EventLog()
        build(manifest, tmp_path / out, jobs=2, progress=False, events=ev)
        tasks = sum(e["count"] for e in ev.events if e["event"] == "tasks")
        at_end = [
            t for t in trims if t != "read_routed"
        ]  # and after every block read (a long task's blocks)
        assert tasks >= 2 and len(at_end) == tasks and trims.count("read_routed") >= 2


def test_local_pack_tasks_delete_their_spill_files_as_they_go(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    """With threads, each pack task deletes the spill files it consumed (so their dirty pages never
    reach the disk), each read task its routed rows, each shard its parked columns; the shards
    are those of a build that keeps everything to the end (what cluster backends do: a rerun task
    needs its files)."""
    import pipeline.modalities.perturbation.pack
    from pipeline.build import build

    build_dataset(tmp_path, "sources", sources=2, cells=300)
    manifest = write_manifest(tmp_path / "m.toml")
    monkeypatch.setattr(pipeline.modalities.perturbation.pack, "FUSE_BYTES", 0)
    monkeypatch.setattr(pipeline.modalities.perturbation.pack, "SCATTER_BYTES", 40_000)
    monkeypatch.setattr(parking, "PARK_BYTES", 0)  # spill files, not the memory park
    left: list[list[str]] = []
    real = pipeline.modalities.perturbation.pack.pack_shard

    def spy(t: Any, shard: Any, tasks: int, cfg: Any) -> Any:
        out = real(t, shard, tasks, cfg)
        left.append(
            [
                p.name
                for p in cfg.spill.iterdir()
                if p.name.startswith(f"{t.number:06d}-")
                or (p.name.startswith("plan-") and p in shard.columns.values())
            ]
        )
        return out

    monkeypatch.setattr(pipeline.modalities.perturbation.pack, "pack_shard", spy)
    build(manifest, tmp_path / "dropped", jobs=2, progress=False)
    assert len(left) > 2 and not any(left)
    monkeypatch.setattr(
        pipeline.modalities.perturbation.pack.PackConfig,
        "__init__",
        _keeping(pipeline.modalities.perturbation.pack.PackConfig.__init__),
    )
    left.clear()
    build(manifest, tmp_path / "kept", jobs=2, progress=False)
    assert all(left)  # every shard's spill files were still there after its task
    for a in sorted((tmp_path / "dropped" / "shards").iterdir()):
        assert fmt.content_hash(a) == fmt.content_hash(tmp_path / "kept" / "shards" / a.name)


def _keeping(init: Any) -> Any:
    def keep(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **{**k, "drop_spill": False})

    return keep


def test_whole_source_tasks_build_the_same_shards(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    """With two spilled sources a job, a source is one task (read, then pack its shards): no phase-2
    tasks, and the same bytes as the two phases of row-range reads and per-shard packs."""
    import pipeline.modalities.perturbation.pack
    import pipeline.modalities.perturbation.routing
    from pipeline.build import build
    from pipeline.events import EventLog

    build_dataset(tmp_path, "sources", sources=2, cells=300)
    manifest = write_manifest(tmp_path / "m.toml")
    monkeypatch.setattr(pipeline.modalities.perturbation.pack, "FUSE_BYTES", 0)
    monkeypatch.setattr(pipeline.modalities.perturbation.pack, "SCATTER_BYTES", 40_000)
    monkeypatch.setattr(parking, "PARK_BYTES", 0)  # spill files, not the memory park
    phases = {}
    for jobs in (
        1,
        2,
    ):  # 2 sources: one job has two a job (whole sources), two jobs do not (two phases)
        ev = EventLog()
        build(manifest, tmp_path / f"j{jobs}", jobs=jobs, progress=False, events=ev)
        phases[jobs] = {e["phase"]: e["count"] for e in ev.events if e["event"] == "tasks"}
    assert phases[1] == {"read sources": 2} and phases[2]["pack shards"] > 2
    assert (
        fmt.index_path(tmp_path / "j1").read_bytes() == fmt.index_path(tmp_path / "j2").read_bytes()
    )
    for a in sorted((tmp_path / "j1" / "shards").iterdir()):
        assert fmt.content_hash(a) == fmt.content_hash(tmp_path / "j2" / "shards" / a.name)
