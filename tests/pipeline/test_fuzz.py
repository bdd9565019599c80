"""Hypothesis against the validators: every fuzzed input is either accepted and round-trips exactly,
or is refused with our error type (SourceError / ManifestError, exit 2), never another exception.

* CSR blocks: (indptr, indices, values, dtypes, declared shape) written to an H5-CSR file and read
back through
  the source (whole and as a sub-block) and the build's duplicate summing; accepted blocks must
  equal the
  dense matrix that adding up the entries gives, exactly.
* Manifests: values of every key, of every type, loaded (many examples), and built end to end on a
tiny
  source (a few examples): exit 0 with a sound dataset, or exit 2 with a message, never a traceback.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.errors import ManifestError, SourceError
from pipeline.manifest import load_manifest
from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from pipeline.modalities.perturbation.h5csr import H5CsrSource
from pipeline.modalities.perturbation.validate import FLOAT32_EXACT, sum_duplicates
from pipeline.verify import verify

FAST = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOAT_DTYPES = ("float16", "float32", "float64")
SPECIAL = (
    math.nan,
    math.inf,
    -math.inf,
    FLOAT32_EXACT + 1.0,
    -(FLOAT32_EXACT + 1.0),
    FLOAT32_EXACT,
    1e39,
    0.5,
)


@st.composite
def csr_blocks(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid blocks (so both outcomes are exercised), each with a chance of one kind of
    damage."""
    n_rows, n_cols = draw(st.integers(0, 5)), draw(st.integers(0, 6))
    lengths = draw(st.lists(st.integers(0, 4 if n_cols else 0), min_size=n_rows, max_size=n_rows))
    nnz = sum(lengths)
    lo, hi = (
        (-1, n_cols) if draw(st.integers(0, 4)) == 0 else (0, n_cols - 1)
    )  # -1 and n_cols: out of range
    indices = draw(st.lists(st.integers(lo, hi), min_size=nnz, max_size=nnz)) if hi >= lo else []
    dtype = draw(st.sampled_from(INT_DTYPES + FLOAT_DTYPES))
    odd = draw(st.integers(0, 3)) == 0  # extreme values: dtype limits, NaN/inf, beyond 2**24
    if dtype in INT_DTYPES:
        info = np.iinfo(dtype)
        value = (
            st.one_of(st.integers(-3, 20), st.sampled_from([int(info.min), int(info.max)]))
            if odd
            else st.integers(0, 20)
        )
        data = [
            min(max(v, int(info.min)), int(info.max))
            for v in draw(st.lists(value, min_size=nnz, max_size=nnz))
        ]
    else:
        value = (
            st.one_of(st.integers(-3, 20).map(float), st.sampled_from(SPECIAL))
            if odd
            else st.integers(0, 20).map(float)
        )
        data = draw(st.lists(value, min_size=nnz, max_size=nnz))
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if draw(st.integers(0, 3)) == 0:  # damage the row pointers
        at = draw(st.integers(0, indptr.size - 1))
        indptr[at] += draw(st.sampled_from([-2, -1, 1, 3]))
    odd_types = draw(st.integers(0, 3)) == 0
    with np.errstate(
        over="ignore", invalid="ignore"
    ):  # 1e39 into float16 is inf: a value to refuse, not a bug
        values = np.asarray(data, dtype)
    return {
        "shape": (n_rows, n_cols),
        "indptr": indptr.astype(
            draw(st.sampled_from(["uint32", "float64"])) if odd_types else "int64"
        ),
        "indices": np.asarray(
            indices, draw(st.sampled_from(["int64", "float32"])) if odd_types else "int32"
        ),
        "data": values,
        "counts": draw(st.booleans()),
        "sub": (draw(st.integers(0, n_rows)), draw(st.integers(0, n_rows))),
    }


def _write(path: Path, block: dict[str, Any]) -> None:
    with h5py.File(path, "w") as f:
        x = f.create_group("X")
        x.attrs["shape"] = np.asarray(block["shape"], np.int64)
        for name in ("data", "indices", "indptr"):
            x.create_dataset(name, data=block[name])


def _expected(block: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The dense matrix an accepted block stands for, and how far each value may be from it: entries
    that repeat a column are summed in float32, the stored type, so a cell of k entries may be
    off by the rounding of k - 1 float32 additions, (k - 1) * 2**-24 * sum(|entries|) (16777216 +
    1 is 16777216 in float32); a cell of one entry is exact. Asserts the block was valid (else it
    was accepted wrongly)."""
    indptr, indices, data = (np.asarray(block[k]) for k in ("indptr", "indices", "data"))
    n_rows, n_cols = block["shape"]
    assert (
        indptr.size == n_rows + 1
        and indptr[0] == 0
        and (np.diff(indptr) >= 0).all()
        and indptr[-1] == data.size
    )
    assert indices.dtype.kind in "iu" and ((indices >= 0) & (indices < n_cols)).all()
    exact = data.astype(np.float64)
    assert np.isfinite(exact).all() and not (block["counts"] and (exact < 0).any())
    if data.dtype.kind in "iu" or block["counts"]:
        assert (np.abs(exact) <= FLOAT32_EXACT).all(), "a value float32 cannot hold was accepted"
    else:
        exact = data.astype(np.float32).astype(
            np.float64
        )  # floats are stored as float32: that cast is the contract
    cell = (
        np.repeat(np.arange(n_rows), np.diff(indptr).astype(np.int64)),
        indices.astype(np.int64),
    )
    dense, mass, terms = (
        np.zeros((n_rows, n_cols)),
        np.zeros((n_rows, n_cols)),
        np.zeros((n_rows, n_cols)),
    )
    np.add.at(dense, cell, exact)
    np.add.at(mass, cell, np.abs(exact))
    np.add.at(terms, cell, 1)
    return dense, np.maximum(terms - 1, 0) * 2.0**-24 * mass * 1.001


@FAST
@given(block=csr_blocks())
@example(
    block={
        "shape": (2, 1),
        "indptr": np.array([0, 2, 6]),
        "indices": np.zeros(6, np.int32),  # found by CI:
        "data": np.array([0, 0, 0, 0, 1, 2**24], np.float32),
        "counts": False,
        "sub": (0, 0),
    }
)  # 2**24+1
def test_fuzzed_csr_blocks_round_trip_or_are_refused(block: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.h5"
        _write(path, block)
        a, b = sorted(block["sub"])
        try:
            with H5CsrSource(path, counts=block["counts"]) as src:
                meta = src.meta([])
                whole = [
                    sum_duplicates(src.read_rows(0, meta.n_rows))[0],
                    sum_duplicates(src.read_rows(a, b))[0],
                ]
                for m in whole:  # the summed block must still be valid (a sum can overflow float32)
                    if m.nnz and not np.isfinite(m.data).all():
                        raise SourceError(
                            path, "sum overflowed"
                        )  # pack re-validates and refuses it the same way
        except SourceError as e:
            assert str(path) in str(e)
            event("refused")
            return
        event("accepted")
        dense, slack = _expected(block)
        got = [m.toarray().astype(np.float64) for m in whole]
        for m in (
            whole
        ):  # one entry per column in every row (rows with distinct columns keep their order)
            assert all(
                np.unique(m.indices[m.indptr[r] : m.indptr[r + 1]]).size
                == m.indptr[r + 1] - m.indptr[r]
                for r in range(m.shape[0])
            )
        for g, want, tol in ((got[0], dense, slack), (got[1], dense[a:b], slack[a:b])):
            off = np.abs(g - want) > tol
            assert not off.any(), (
                f"cells {np.argwhere(off).tolist()}: {g[off]} != {want[off]} (+-{tol[off]})"
            )


@st.composite
def dense_blocks(draw: st.DrawFn) -> dict[str, Any]:
    shape = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    dtype = draw(st.sampled_from(INT_DTYPES + FLOAT_DTYPES))
    if dtype in INT_DTYPES:
        info = np.iinfo(dtype)
        value = st.one_of(st.integers(0, 20), st.sampled_from([int(info.min), int(info.max), 0]))
    else:
        value = st.one_of(st.integers(0, 20).map(float), st.sampled_from(SPECIAL))
    values = draw(st.lists(value, min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]))
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.asarray(values, dtype).reshape(shape)
    return {"x": x, "counts": draw(st.booleans())}


@FAST
@given(block=dense_blocks())
def test_fuzzed_dense_matrices_round_trip_or_are_refused(block: dict[str, Any]) -> None:
    x = block["x"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("X", data=x)
        try:
            with H5CsrSource(path, counts=block["counts"]) as src:
                got = src.read_rows(0, x.shape[0]).toarray().astype(np.float64)
        except SourceError as e:
            assert str(path) in str(e)
            event("refused")
            return
    event("accepted")
    exact = x.astype(np.float64)
    assert np.isfinite(exact).all() and not (block["counts"] and (exact < 0).any())
    if x.dtype.kind in "iu" or block["counts"]:
        assert (np.abs(exact) <= FLOAT32_EXACT).all(), "a value float32 cannot hold was accepted"
    else:
        exact = x.astype(np.float32).astype(np.float64)
    np.testing.assert_array_equal(got, exact)


# --- manifests
# --------------------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=8)
SCALAR = st.one_of(st.integers(-2, 2**63 - 1), st.floats(allow_nan=True), st.booleans(), TEXT)
ANY = st.one_of(SCALAR, st.lists(st.one_of(TEXT, st.integers(-1, 3)), max_size=3))

BASE: dict[str, dict[str, Any]] = {
    "dataset": {
        "name": "f",
        "kind": "perturbation",
        "seed": 0,
        "shard_size_mb": 0.05,
        "block_rows": 97,
    },
    "fields": {
        "perturbation": "perturbation",
        "control": ["control"],
        "cell_type": "cell_type",
        "batch": "batch",
        "covariates": ["timepoint"],
        "values": "counts",
    },
    "pairing": {"strategy": "batch", "max_pairs_per_condition": 50, "sentence_size": 8},
    "split": {"mode": "random", "val_fraction": 0.1, "test_fraction": 0.2},
}
# plausible values per key: what an operator might type, right or wrong
PLAUSIBLE: dict[tuple[str, str], st.SearchStrategy[Any]] = {
    ("dataset", "seed"): st.integers(-3, 2**63 - 1),
    ("dataset", "shard_size_mb"): st.one_of(
        st.sampled_from([math.nan, math.inf, -1.0, 0.0, 1e-9, 5e-5, 1e-4, 0.01, 1e300]),
        st.floats(1e-5, 10.0),
    ),
    ("dataset", "codec"): st.sampled_from(["blosc-lz4", "blosc-zstd", "zstd", "none", "gzip"]),
    ("dataset", "codec_level"): st.integers(-2, 30),
    ("dataset", "format"): st.sampled_from(["zarr", "tar", "parquet"]),
    ("dataset", "block_rows"): st.sampled_from([-1, 0, 1, 7, 300, 2**40]),
    ("fields", "control"): st.lists(st.sampled_from(["control", "KO_1", "", "nope"]), max_size=3),
    ("fields", "covariates"): st.lists(
        st.sampled_from(["timepoint", "perturbation", "batch", "cell_type", "nothing"]), max_size=3
    ),
    ("fields", "batch"): st.sampled_from(["batch", "", "timepoint", "nope"]),
    ("fields", "cell_type"): st.sampled_from(["cell_type", "", "batch", "nope"]),
    ("fields", "values"): st.sampled_from(["counts", "any", "logs"]),
    ("pairing", "strategy"): st.sampled_from(["batch", "random", "nearest"]),
    ("pairing", "max_pairs_per_condition"): st.sampled_from([-1, 0, 1, 5, 10**12]),
    ("pairing", "sentence_size"): st.sampled_from([-1, 0, 1, 8, 40, 8192, 8193, 10**9]),
    ("fields", "numeric_covariates"): st.lists(
        st.sampled_from(["timepoint", "perturbation", "nope"]), max_size=2
    ),
    ("fields", "combination_separator"): st.sampled_from(["_", "", "+"]),
    ("split", "combinations"): st.sampled_from(["any", "seen_genes", "all"]),
    ("split", "mode"): st.sampled_from(["random", "zeroshot", "fewshot", "sideways"]),
    ("split", "val_fraction"): st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0, -0.1, math.nan]),
    ("split", "test_fraction"): st.sampled_from([0.0, 0.2, 0.5, 1.0, math.nan]),
    ("split", "val_cell_types"): st.lists(st.sampled_from(["K562", "HepG2", "nope"]), max_size=2),
    ("split", "test_cell_types"): st.lists(st.sampled_from(["K562", "HepG2"]), max_size=2),
    ("split", "controls"): st.sampled_from(["heldout", "train", "elsewhere"]),
}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return (
            "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        )
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string (no surrogates drawn)
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def _toml(doc: dict[str, dict[str, Any]], pattern: str) -> str:
    out = []
    for section, table in doc.items():
        out.append(f"[{section}]")
        out += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
        if section == "dataset":
            out += ["", "[[sources]]", f"path = {json.dumps(pattern)}", 'type = "h5ad"']
        out.append("")
    return "\n".join(out)


@st.composite
def manifests(draw: st.DrawFn, wild: bool) -> dict[str, dict[str, Any]]:
    doc = {s: dict(t) for s, t in BASE.items()}
    for (section, key), plausible in PLAUSIBLE.items():
        if (
            draw(st.integers(0, 9)) == 0
        ):  # change a few keys: each test of one value runs past the others
            doc[section][key] = draw(st.one_of(plausible, ANY) if wild else plausible)
    if wild and draw(st.integers(0, 4)) == 0:
        doc[draw(st.sampled_from(sorted(doc)))][draw(TEXT)] = draw(ANY)  # an unknown (or odd) key
    return doc


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "src").mkdir()
    write_perturb_h5ad(root / "src/a.h5ad", n_cells=80, n_genes=20, n_perts=3, seed=0)
    return root


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=manifests(wild=True))
# found in CI: a bare "" was read as a covariate column named '' (now refused), and the test's own
# check read a bare string as its characters
@example(doc={**BASE, "fields": {**BASE["fields"], "covariates": ""}})
@example(doc={**BASE, "fields": {**BASE["fields"], "covariates": "timepoint"}})
def test_fuzzed_manifests_load_or_are_refused(
    doc: dict[str, dict[str, Any]], source_dir: Path
) -> None:
    path = source_dir / "wild.toml"
    path.write_text(_toml(doc, "src/*.h5ad"))
    try:
        m = load_manifest(path)
    except ManifestError as e:
        # a key is named, except for a problem of the whole file (not TOML), which names none
        assert str(path) in str(e) and ("[" in str(e) or e.key == "-")
        assert "[-]" not in str(e)
        event("refused")
        return
    event("accepted")
    ds, fl = doc["dataset"], doc["fields"]  # accepted: the values arrive as written
    assert (m.seed, m.shard_size_mb, m.block_rows) == (
        ds["seed"],
        float(ds["shard_size_mb"]),
        ds["block_rows"],
    )
    assert m.seed >= 0 and math.isfinite(m.shard_size_mb) and m.shard_size_mb > 0
    assert m.config.fields.control == _listed(fl["control"]) and len(m.config.fields.control) > 0
    assert m.config.fields.covariates == _listed(fl["covariates"])
    assert all(c.strip() for c in m.config.fields.covariates)  # a column has a name


def _listed(v: str | list[str]) -> tuple[str, ...]:
    """A string list as the manifest reads it: a bare string is a list of one (`control =
    "non-targeting"`), not its characters."""
    return (v,) if isinstance(v, str) else tuple(v)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(doc=manifests(wild=False))
def test_fuzzed_manifests_build_or_exit_2(
    doc: dict[str, dict[str, Any]], source_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = source_dir / "plausible.toml"
    path.write_text(_toml(doc, "src/*.h5ad"))
    out = Path(tempfile.mkdtemp(dir=source_dir))
    capsys.readouterr()
    rc = main(["build", str(path), "--out", str(out / "ds"), "--jobs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    event(
        f"exit {rc}" + (f": {err.split(']')[0].split('[')[-1]}" if rc == 2 and "[" in err else "")
    )
    if rc == 0:
        assert verify(out / "ds") == []
    else:
        assert rc == 2 and err.startswith("error: "), err
