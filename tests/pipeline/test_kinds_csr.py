"""A record kind with a csr field and a shard table, defined in this module only (its manifest's
``plugins`` names this module): a csr value handed over as a dense row, as (indices, values) or as
scipy sparse reads back the same, for zarr and tar, with the table per shard; its source type held
to the contract; verify lists a table missing from a shard; a misshapen value or a code outside its
bound fails the build, naming the file, record and field. The toy kind of tests/plugin_toy.py:
tests/pipeline/test_kinds.py."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sps

from loaders import format as fmt
from loaders.format.readers import read_shard
from pipeline.build import build
from pipeline.errors import SourceError
from pipeline.manifest import Manifest, SourceSpec
from pipeline.model import ScannedSource, register_kind
from pipeline.records import Record, RecordKind
from pipeline.source import Source, register_source
from pipeline.testing import SourceTypeContract
from pipeline.verify import verify

N_COLS = 10


@register_source
class RowsSource(Source):
    """``.rows`` files: JSON ``[{"group": str, "row": [N_COLS floats], "label": int, "form":
    str}]``."""

    type = "rows"
    kinds = ("sparserows",)
    suffixes = (".rows",)
    produces = ("row", "label")

    def records(self) -> list[dict[str, Any]]:
        return list(json.loads(self.path.read_text()))


@register_kind
class SparseRowsKind(RecordKind):
    """A csr ``row`` per record (handed over as a dense row, as (indices, values) or as scipy
    sparse, by the record's ``form``), a dense ``label`` code below 3, and a ``neighbours``
    table: consecutive local rows."""

    name = "sparserows"
    samples = ()

    def parse(self, path: Path, sections: Mapping[str, Any]) -> None:
        return None

    def scan_source(self, manifest: Manifest, spec: SourceSpec) -> list[Record]:
        return [
            Record(i, r["group"], (i,), nbytes=40)
            for i, r in enumerate(RowsSource(spec.path).records())
        ]

    def schema(
        self, manifest: Manifest, scanned: Sequence[ScannedSource]
    ) -> tuple[fmt.FieldSpec, ...]:
        return (
            fmt.FieldSpec(fmt.SAMPLE_ID, "dense", "int64"),
            fmt.FieldSpec("row", "csr", "float32", (N_COLS,)),
            fmt.FieldSpec("label", "dense", "int32", bound=3),
        )

    def tables(self, manifest: Manifest) -> tuple[str, ...]:
        return ("neighbours",)

    def shard_tables(self, manifest: Manifest, records: Sequence[Record]) -> dict[str, np.ndarray]:
        n = len(records)
        return {
            "neighbours": np.stack([np.arange(n - 1), np.arange(1, n)], 1)
            .astype(np.int32)
            .reshape(-1, 2)
        }

    def read_record(
        self, manifest: Manifest, spec: SourceSpec, record: Record
    ) -> tuple[dict[str, Any], Any]:
        r = RowsSource(spec.path).records()[record.index]
        row = np.asarray(r["row"], np.float32)
        nz = np.flatnonzero(row)
        value = {"dense": row, "tuple": (nz, row[nz]), "scipy": sps.csr_matrix(row[None, :])}[
            r["form"]
        ]
        return {"row": value, "label": r["label"]}, None


class TestRowsType(SourceTypeContract):
    source_type = "rows"


ROWS_MANIFEST = """
[dataset]
name = "rows"
kind = "sparserows"
format = "{fmt}"
shard_size_mb = 0.0002
plugins = ["tests.pipeline.test_kinds_csr"]

[[sources]]
path = "*.rows"
"""


def _rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    dense = rng.random((n, N_COLS)) * (rng.random((n, N_COLS)) < 0.3)
    return [
        {
            "group": f"g{i // 3}",
            "row": dense[i].round(3).tolist(),
            "label": int(i % 3),
            "form": ("dense", "tuple", "scipy")[i % 3],
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("encoding", ["zarr", "tar"])
def test_csr_fields_and_tables_of_a_record_kind(tmp_path: Path, encoding: str) -> None:
    rows = _rows(17, 0)
    (tmp_path / "a.rows").write_text(json.dumps(rows))
    (tmp_path / "m.toml").write_text(ROWS_MANIFEST.format(fmt=encoding))
    res = build(tmp_path / "m.toml", tmp_path / "out", jobs=2, progress=False)
    assert verify(tmp_path / "out") == []
    index = fmt.read_index(tmp_path / "out")
    assert index.tables == ["neighbours"] and index.field("row").layout == "csr"
    seen = {}
    for entry in index.shards:
        cols = read_shard(
            index.shard_path(entry), encoding, fmt.shard_keys(index.fields, index.tables)
        )
        x = sps.csr_matrix(
            (cols["row/data"], cols["row/indices"], cols["row/indptr"]),
            shape=(entry.records, N_COLS),
        )
        for local, sid in enumerate(cols[fmt.SAMPLE_ID].tolist()):
            seen[sid] = (x[local].toarray()[0], int(cols["label"][local]))
        assert cols["neighbours"].shape == (max(0, entry.records - 1), 2)
    assert sorted(seen) == list(range(len(rows))) and len(res.index["shards"]) > 2
    for sid, (row, label) in seen.items():
        np.testing.assert_array_equal(row, np.asarray(rows[sid]["row"], np.float32))
        assert label == rows[sid]["label"]


def test_verify_lists_a_table_missing_from_a_shard(tmp_path: Path) -> None:
    import shutil

    (tmp_path / "a.rows").write_text(json.dumps(_rows(9, 1)))
    (tmp_path / "m.toml").write_text(ROWS_MANIFEST.format(fmt="zarr"))
    build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    index = fmt.read_index(tmp_path / "out")
    victim = index.shard_path(index.shards[0])
    shutil.rmtree(victim / "neighbours")
    problems = verify(tmp_path / "out", check_hashes=False)
    assert len(problems) == 1 and str(victim) in problems[0] and "'neighbours'" in problems[0]


def test_a_misshapen_record_value_names_the_file_record_and_field(tmp_path: Path) -> None:
    rows = _rows(6, 2)
    rows[4]["row"] = rows[4]["row"][:-1]  # 9 values for a csr field of 10 columns
    rows[4]["form"] = "dense"
    (tmp_path / "a.rows").write_text(json.dumps(rows))
    (tmp_path / "m.toml").write_text(ROWS_MANIFEST.format(fmt="zarr"))
    with pytest.raises(SourceError) as e:
        build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
    msg = str(e.value)
    assert "a.rows" in msg and "record 4" in msg and "'row'" in msg and "[9]" in msg
    assert not (tmp_path / "out" / "index.json").exists()


def test_a_code_outside_its_bound_fails_the_build(tmp_path: Path) -> None:
    rows = _rows(6, 3)
    rows[2]["label"] = 3
    (tmp_path / "a.rows").write_text(json.dumps(rows))
    (tmp_path / "m.toml").write_text(ROWS_MANIFEST.format(fmt="tar"))
    with pytest.raises(fmt.FormatError, match=r"'label' has values outside \[0, 3\)"):
        build(tmp_path / "m.toml", tmp_path / "out", jobs=1, progress=False)
