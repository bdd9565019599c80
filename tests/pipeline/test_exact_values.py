"""Values are stored exactly or refused (cases: tests/hostile/values.py, point 5): duplicate column
indices summed once at build time, integers float32 cannot hold refused, unnamed gene spaces
never merged silently."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import pipeline.modalities.perturbation.pack
import pipeline.parking
from loaders import format as fmt
from loaders.modalities.perturbation.ops import densify
from loaders.modalities.perturbation.torch_ops import densify_torch
from pipeline.cli import main
from pipeline.modalities.perturbation.demo import write_h5csr
from tests import hostile

MANIFEST = """
[dataset]
name = "exact"
kind = "perturbation"
seed = 0
shard_size_mb = 0.02

[[sources]]
path = "src/*.h5"
type = "h5csr"
{extra}
[fields]
perturbation = "gene"
control = ["non-targeting"]
cell_type = "cell_line"
batch = "gem_group"
values = "counts"
"""


def _manifest(root: Path, extra: str = "") -> Path:
    path = root / "m.toml"
    path.write_text(MANIFEST.format(extra=extra))
    return path


def _build(manifest: Path, out: Path) -> int:
    return main(["build", str(manifest), "--out", str(out), "--jobs", "1", "--no-progress"])


def _read_x(path: Path) -> sp.csr_matrix:
    with h5py.File(path, "r") as f:
        x = f["X"]
        return sp.csr_matrix(
            (x["data"][()], x["indices"][()], x["indptr"][()]), shape=tuple(x.attrs["shape"])
        )


def _write_x(path: Path, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray) -> None:
    with h5py.File(path, "r+") as f:
        for name, a in (("data", data), ("indices", indices), ("indptr", indptr)):
            del f["X"][name]
            f["X"].create_dataset(name, data=a)


def _split_entries(x: sp.csr_matrix, rows: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """The same matrix with every entry >= 2 of `rows` stored as two entries of one column (1 and v
    - 1),
    written in reverse column order; and the number of extra entries per row."""
    data, indices, indptr, extra = [], [], [0], np.zeros(x.shape[0], np.int64)
    for r in range(x.shape[0]):
        d, i = x.data[x.indptr[r] : x.indptr[r + 1]], x.indices[x.indptr[r] : x.indptr[r + 1]]
        if r in rows and (d >= 2).any():
            big = d >= 2
            d = np.concatenate([np.where(big, 1, d), d[big] - 1])[::-1]
            i = np.concatenate([i, i[big]])[::-1]
            extra[r] = int(big.sum())
        data.append(d)
        indices.append(i)
        indptr.append(indptr[-1] + d.size)
    data_a = np.concatenate(data).astype(x.dtype)
    return sp.csr_matrix(
        (data_a, np.concatenate(indices), np.asarray(indptr)), shape=x.shape
    ), extra


@hostile.parametrize
def test_duplicate_columns_are_summed_once_at_build(
    case: hostile.Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    read_all: Callable[..., Any],
    shard_csr: Callable[..., Any],
) -> None:
    src = write_h5csr(tmp_path / "src/k562.h5", n_cells=300, n_genes=80, n_perts=4, seed=1)
    x = _read_x(src)
    dup, extra = _split_entries(x, np.arange(0, 300, 3))
    assert extra.sum() > 50 and dup.nnz == x.nnz + extra.sum()
    _write_x(src, dup.data, dup.indices, dup.indptr)
    if case.data["spill"]:
        monkeypatch.setattr(pipeline.modalities.perturbation.pack, "FUSE_BYTES", 0)
        monkeypatch.setattr(pipeline.modalities.perturbation.pack, "SCATTER_BYTES", 1)
        monkeypatch.setattr(pipeline.parking, "PARK_BYTES", 0)  # files, not the memory park
    assert _build(_manifest(tmp_path), tmp_path / "out") == 0
    index, shards = read_all(tmp_path / "out")
    want = 0
    for _, cols in shards:
        m = shard_csr(cols, x.shape[1])
        rows = cols[fmt.SAMPLE_ID]
        assert (
            m.has_canonical_format and m.nnz == x[rows].nnz
        )  # one sorted entry per column, as in the source
        np.testing.assert_array_equal(m.toarray(), x[rows].toarray())
        parts = (
            cols["X/indptr"].astype(np.int64),
            cols["X/indices"].astype(np.int64),
            cols["X/data"],
        )
        cpu = densify(
            *parts, (rows.size, x.shape[1])
        )  # the loader's CPU path sums; the device path's
        dev = densify_torch(
            *(torch.from_numpy(a) for a in parts), (rows.size, x.shape[1])
        )  # scatter_ keeps one
        np.testing.assert_array_equal(cpu, dev.numpy())
        want += int(extra[rows].sum())  # a control copied into several shards counts in each
    assert index.stats["duplicate_entries_summed"] == want > 0
    assert (
        sum(c["duplicate_entries_summed"] for c in index.stats["counts_by_shard"].values()) == want
    )


@hostile.parametrize
def test_values_float32_cannot_hold_are_refused(
    case: hostile.Case,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    read_all: Callable[..., Any],
) -> None:
    src = write_h5csr(tmp_path / "src/k562.h5", n_cells=200, n_genes=50, n_perts=3, seed=2)
    x = _read_x(src)
    data = x.data.astype(case.data["dtype"])
    data[17] = case.data["value"]
    _write_x(src, data, x.indices, x.indptr)
    capsys.readouterr()
    rc = _build(_manifest(tmp_path), tmp_path / "out")
    err = capsys.readouterr().err
    if case.data["refused"]:
        row = int(np.searchsorted(x.indptr, 17, side="right")) - 1
        assert (
            rc == 2 and str(src) in err and f"row {row}:" in err and str(case.data["value"]) in err
        ), err
        assert "2**24" in err and "[fields]" in err and not (tmp_path / "out/index.json").exists()
        return
    assert rc == 0, err
    _, shards = read_all(tmp_path / "out")
    stored = np.concatenate([cols["X/data"] for _, cols in shards])
    assert float(stored.max()) == case.data["value"]


@hostile.parametrize
def test_sources_without_gene_names(
    case: hostile.Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [
        write_h5csr(tmp_path / f"src/{n}.h5", n_cells=150, n_genes=40, n_perts=3, seed=i)
        for i, n in enumerate(["hepg2", "k562"][: case.data["files"]])
    ]
    for p in files:
        with h5py.File(p, "r+") as f:
            del f["var"]
    extra = "same_genes = true\n" if case.data["same_genes"] else ""
    capsys.readouterr()
    rc = _build(_manifest(tmp_path, extra), tmp_path / "out")
    err = capsys.readouterr().err
    if case.data["files"] > 1 and not case.data["same_genes"]:
        assert (
            rc == 2
            and str(files[0]) in err
            and "no gene names" in err
            and "same_genes = true" in err
        ), err
        return
    assert rc == 0, err
    index = fmt.read_index(tmp_path / "out")
    assert index.section()["var_names"][:2] == ["gene_0", "gene_1"]
