"""The plan's compact paths give what the straightforward ones give: the condition table counted in a
presence table equals np.unique's (rows, order and inverse)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pipeline.plan.conditions as conditions
from loaders import format as fmt


@pytest.mark.parametrize("sizes", [(7, 3, 5), (1,), (300, 2, 9, 4)])
def test_distinct_rows_dense_equals_the_sort(sizes: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(len(sizes))
    cols = [rng.integers(0, s, 5000).astype(np.int32) for s in sizes]
    inverse, table = conditions.distinct_rows(cols)
    monkeypatch.setattr(conditions, "DENSE_KEYS", 0)  # force the np.unique path
    inverse_sorted, table_sorted = conditions.distinct_rows(cols)
    assert np.array_equal(table, table_sorted) and np.array_equal(inverse, inverse_sorted)
    assert inverse.dtype == np.int32 and table.dtype == np.int32
    assert np.array_equal(table[inverse], np.stack(cols, axis=1))


def test_the_plan_holds_a_few_compact_bytes_per_cell(tmp_path: Path) -> None:
    """What planning holds for every cell of the dataset at once (its peak at millions of cells) is kept in
    the smallest types, and the barcodes are not kept at all; the planned shard columns are unchanged:
    int32 codes and condition ids, int64 sample ids (row + the rows of the sources before), the source's
    barcodes of the shard's rows."""
    import anndata as ad

    from pipeline.demo import write_perturb_h5ad
    from pipeline.manifest import load_manifest
    from pipeline.plan import make_plan
    from pipeline.scan import scan
    from tests.pipeline_helpers import write_manifest

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
    held = (cells.source, cells.row, cells.is_control, plan.conditions.cond_id, *cells.codes.values())
    assert sum(a.nbytes for a in held) / len(cells) <= 12  # int32/int64 columns: 41 bytes a cell
    offsets = np.cumsum([0] + [s.meta.n_rows for s in scanned])
    names = [np.asarray(ad.read_h5ad(p, backed="r").obs_names) for p in paths]
    off_key, val_key = fmt.ragged_keys(fmt.OBS_NAMES)
    for sh in plan.shards:
        c = sh.columns
        assert c[fmt.SAMPLE_ID].dtype == np.int64
        assert np.array_equal(c[fmt.SAMPLE_ID], sh.rows + offsets[sh.source])
        assert c[fmt.COND_ID].dtype == np.int32
        assert all(c[fmt.OBS_PREFIX + f].dtype == np.int32 for f in manifest.config.fields.obs_fields)
        got = [bytes(c[val_key][a:b]).decode() for a, b in zip(c[off_key][:-1], c[off_key][1:], strict=True)]
        assert got == names[sh.source][sh.rows].tolist()
