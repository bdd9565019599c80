"""The shared builders of the tests, reached through fixtures: no test module imports another.

``build_dataset`` is the one way to make a dataset: h5ad sources, a manifest over them, a build in
one or more formats, or (``stage="shards"``) shards written straight through the shard writer, for
the loader tests (that writer is tests/fixtures_shards.py, a plug-in registered here);
``small_manifest`` and ``built_zarr_tar`` are presets of it. The other fixtures here return the
plain functions of the same name (manifests, reading shards back). Fixtures that several folders
share but that would overfill this file are in tests/plugin_fixtures.py (batches compared, CT .npy
builds, a gloo world, the pack path); those of one folder are in that folder's conftest.py
(tests/remote/: the S3 server and proxy; tests/loaders/; tests/pipeline/: fresh interpreters;
tests/modalities/ct/: the CT reference).
Heavy modules are imported where used, so that a test module imports what it did before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    import scipy.sparse as sp

    from loaders import format as fmt
    from tests.fixtures_shards import Truth

pytest_plugins = [
    "tests.plugin_fixtures",
    "tests.fixtures_shards",
]


# -- manifests ----------------------------------------------------------------------------------
MANIFEST = """
[dataset]
name = "{name}"
kind = "perturbation"
format = "{format}"
seed = {seed}
shard_size_mb = {shard_mb}
block_rows = {block_rows}

[[sources]]
path = "{pattern}"
type = "{type}"

[fields]
perturbation = "{pert}"
control = ["control", "non-targeting"]
cell_type = "cell_type"
batch = "{batch}"
covariates = {covariates}
values = "counts"
obsm = {obsm}

[pairing]
strategy = "{strategy}"
max_pairs_per_condition = {max_pairs}
sentence_size = {sentence_size}

[split]
mode = "{split}"
val_fraction = 0.1
test_fraction = 0.2
"""


def write_manifest(path: Path, **kw: Any) -> Path:
    """A perturbation manifest over ``src/*.h5ad``; ``kw`` changes any key of MANIFEST."""
    params = dict(
        name="t",
        format="zarr",
        seed=0,
        shard_mb=0.05,
        block_rows=97,
        pattern="src/*.h5ad",
        type="h5ad",
        pert="perturbation",
        batch="batch",
        covariates='["timepoint"]',
        obsm='["X_pca"]',
        strategy="batch",
        max_pairs=500,
        sentence_size=8,
        split="random",
    )
    params.update(kw)
    path.write_text(MANIFEST.format(**params))
    return path


# -- datasets -----------------------------------------------------------------------------------
STAGES = ("sources", "manifest", "built", "shards")


@dataclass
class Dataset:
    """What ``build_dataset`` wrote under ``root``."""

    root: Path  # the folder written in; for stage="shards" the dataset itself (index.json)
    sources: list[Path] = field(default_factory=list)  # in manifest order
    manifests: dict[str, Path] = field(default_factory=dict)  # format -> manifest
    outs: dict[str, Path] = field(default_factory=dict)  # format -> built dataset
    # stage="shards": the columns as written, in index order, to compare with what a loader yields
    n_genes: int = 0
    shards: list[dict[str, np.ndarray]] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))  # [C, D]
    _by_sample: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def manifest(self) -> Path:
        (only,) = self.manifests.values()
        return only

    @property
    def out(self) -> Path:
        """The dataset a loader opens: the one built (one format), or ``root`` (stage="shards")."""
        if self.shards:
            return self.root
        (only,) = self.outs.values()
        return only

    def primary_ids(self, split: str) -> np.ndarray:
        from loaders.format import PRIMARY, SAMPLE_ID

        pairs = zip(self.shards, self.splits, strict=True)
        return np.concatenate(
            [s[SAMPLE_ID][s[PRIMARY]] for s, sp in pairs if sp == split] + [np.zeros(0, np.int64)]
        )

    def by_sample(self) -> dict[str, np.ndarray]:
        """Everything written, indexed by sample_id: "X" dense [n_ids, G], "cond_id", "obs/*",
        "obsm/*". A duplicated control shares its original's sample_id and content, so the table
        is well defined."""
        from loaders.format import COND_ID, OBS_PREFIX, OBSM_PREFIX, SAMPLE_ID, X
        from tests.fixtures_shards import OBS_FIELDS, OBSM_KEY

        if not self._by_sample:
            n_ids = 1 + max(int(s[SAMPLE_ID].max()) for s in self.shards)
            table = {"X": np.zeros((n_ids, self.n_genes), np.float32)}
            for s in self.shards:
                ids = s[SAMPLE_ID]
                ptr = s[X + "/indptr"]
                rows = ids[np.repeat(np.arange(ptr.size - 1), np.diff(ptr))]
                table["X"][rows, s[X + "/indices"]] = s[X + "/data"]
                for k in [COND_ID, OBSM_PREFIX + OBSM_KEY, *(OBS_PREFIX + f for f in OBS_FIELDS)]:
                    table.setdefault(k, np.zeros((n_ids, *s[k].shape[1:]), s[k].dtype))[ids] = s[k]
            self._by_sample.update(table)
        return self._by_sample

    @cached_property
    def truth(self) -> Truth:
        from tests.fixtures_shards import Truth

        return Truth(self)


def build_dataset(
    root: str | Path,
    stage: str = "built",
    *,
    formats: Sequence[str] = ("zarr",),
    sources: int = 3,
    cells: int | None = None,
    genes: int | None = None,
    perts: int = 6,
    seed: int = 0,
    source_name: str = "screen_{i}.h5ad",
    name: str | None = None,
    jobs: int = 1,
    n_shards: int = 6,
    splits: Sequence[str] = ("train",),
    density: float = 0.1,
    n_dup_controls: int = 6,
    codec: str = "blosc-lz4",
    **options: Any,
) -> Dataset:
    """A perturbation dataset under ``root``, up to ``stage``:

    - "sources": ``sources`` h5ad files ``root/src/<source_name>`` of ``cells`` cells (500),
      ``genes`` genes (120) and ``perts`` perturbations, source ``i`` written with seed ``i``. A
      source already on disk is kept: a second call over the same root only writes a manifest;
    - "manifest": and a manifest over them, ``root/<name>`` ("m.toml"; "<format>.toml" for several
      formats), with dataset seed ``seed``; ``options`` are more ``write_manifest`` keys;
    - "built": and built once per format (``jobs`` workers) into ``root/out`` (``out-<format>``);
    - "shards": none of those, but ``n_shards`` shards of ``cells`` cells (200) and ``genes`` genes
      (50) written straight into ``root`` through the shard writer, their columns kept to compare
      with (shard i's split is ``splits[i % len(splits)]``; ``seed`` seeds every value).
    """
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}: one of {STAGES}")
    root = Path(root)
    if stage == "shards":
        from tests.fixtures_shards import write_shards

        shards = write_shards(
            root,
            n_shards,
            200 if cells is None else cells,
            50 if genes is None else genes,
            seed,
            splits,
            density,
            n_dup_controls,
            codec,
        )
        return Dataset(root=root, **shards)
    from pipeline.modalities.perturbation.demo import write_perturb_h5ad

    ds = Dataset(root=root)
    (root / "src").mkdir(parents=True, exist_ok=True)
    for i in range(sources):
        path = root / "src" / source_name.format(i=i)
        if not path.exists():
            write_perturb_h5ad(
                path,
                n_cells=500 if cells is None else cells,
                n_genes=120 if genes is None else genes,
                n_perts=perts,
                seed=i,
            )
        ds.sources.append(path)
    if stage == "sources":
        return ds
    for enc in formats:
        file = name or ("m.toml" if len(formats) == 1 else f"{enc}.toml")
        ds.manifests[enc] = write_manifest(root / file, format=enc, seed=seed, **options)
    if stage == "built":
        from pipeline.build import build

        for enc, manifest in ds.manifests.items():
            ds.outs[enc] = root / ("out" if len(formats) == 1 else f"out-{enc}")
            build(manifest, ds.outs[enc], jobs=jobs, progress=False)
    return ds


# -- reading back -------------------------------------------------------------------------------
def read_all(out: Path) -> tuple[fmt.Index, list[tuple[fmt.ShardEntry, dict[str, np.ndarray]]]]:
    from loaders import format as fm
    from loaders.format.readers import read_shard

    index = fm.read_index(out)
    keys = fm.shard_keys(index.fields, index.tables)
    return index, [(e, read_shard(index.shard_path(e), index.encoding, keys)) for e in index.shards]


def shard_csr(cols: dict[str, np.ndarray], n_cols: int) -> sp.csr_matrix:
    import scipy.sparse as sp

    from loaders.format import SAMPLE_ID

    n = cols[SAMPLE_ID].size
    return sp.csr_matrix((cols["X/data"], cols["X/indices"], cols["X/indptr"]), shape=(n, n_cols))


def source_matrix(paths: list[Path]) -> tuple[sp.csr_matrix, list[Any]]:
    """All sources concatenated in manifest order (the sample_id space), read fully."""
    import anndata as ad
    import scipy.sparse as sp

    mats, obs = [], []
    for p in paths:
        a = ad.read_h5ad(p)
        mats.append(sp.csr_matrix(a.X, dtype=np.float32))
        obs.append(a.obs)
    return sp.vstack(mats).tocsr(), obs


def shard_files(out: Path) -> dict[str, tuple[int, int]]:
    """name -> (inode, mtime_ns) of every file in every shard (proof a shard was not rewritten)."""
    from loaders.format import SHARDS_DIR

    res = {}
    for p in sorted((out / SHARDS_DIR).rglob("*")):
        if p.is_file():
            st = p.stat()
            res[str(p.relative_to(out))] = (st.st_ino, st.st_mtime_ns)
    return res


def listing(out: Path) -> set[str]:
    """Every path under ``out`` (folders inside zarr shards left out), relative."""
    names = set()
    for p in out.rglob("*"):
        rel = p.relative_to(out).as_posix()
        if rel.count("/") <= 1:
            names.add(rel)
    return names


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="session", name="build_dataset")
def build_dataset_fixture() -> Callable[..., Any]:
    """build_dataset(root, stage, ...) -> Dataset."""
    return build_dataset


@pytest.fixture(scope="session", name="write_manifest")
def write_manifest_fixture() -> Callable[..., Any]:
    """write_manifest(path, **keys) -> the manifest path."""
    return write_manifest


@pytest.fixture(scope="session", name="read_all")
def read_all_fixture() -> Callable[..., Any]:
    """read_all(out) -> (index, [(entry, columns)]) of a dataset."""
    return read_all


@pytest.fixture(scope="session", name="shard_csr")
def shard_csr_fixture() -> Callable[..., Any]:
    """shard_csr(columns, n_cols) -> a shard's X as scipy CSR."""
    return shard_csr


@pytest.fixture(scope="session", name="source_matrix")
def source_matrix_fixture() -> Callable[..., Any]:
    """source_matrix(paths) -> (CSR of all rows, [obs])."""
    return source_matrix


@pytest.fixture(scope="session", name="shard_files")
def shard_files_fixture() -> Callable[..., Any]:
    """shard_files(out) -> {shard file: (inode, mtime_ns)}."""
    return shard_files


@pytest.fixture(scope="session", name="listing")
def listing_fixture() -> Callable[..., Any]:
    """listing(out) -> every path under out, two levels deep."""
    return listing


@pytest.fixture(scope="session")
def small_manifest() -> Callable[..., Path]:
    """``small_manifest(root, seed=0, name="m.toml") -> Path``: build_dataset's two 200-cell sources
    (s0.h5ad, s1.h5ad: written once per root) and a manifest over them; ``seed`` changes every
    shard."""

    def make(root: Path, seed: int = 0, name: str = "m.toml") -> Path:
        return build_dataset(
            root,
            "manifest",
            sources=2,
            cells=200,
            genes=50,
            perts=4,
            seed=seed,
            name=name,
            source_name="s{i}.h5ad",
        ).manifest

    return make


@pytest.fixture(scope="module")
def built_zarr_tar(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One manifest (2 sources x 300 cells, 60 genes, 5 perturbations) built as zarr and as tar:
    format -> dataset folder."""
    root = tmp_path_factory.mktemp("enc")
    return build_dataset(
        root, formats=("zarr", "tar"), sources=2, cells=300, genes=60, perts=5
    ).outs


@pytest.fixture(scope="session")
def demo_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demos `make shards` builds (data_manifests/demo*.toml over `shardsmith demo`), zarr:
    manifest stem -> dataset folder."""
    from pipeline.build import build  # import weight: the pipeline, only for these tests
    from pipeline.commands.demo import write_demo  # as the line above

    root = tmp_path_factory.mktemp("demos")
    repo = Path(__file__).resolve().parent.parent
    write_demo(root / "data" / "demo")
    (root / "data_manifests").mkdir()
    outs = {}
    for stem in ("demo", "demo_spike", "demo_ct"):
        manifest = root / "data_manifests" / f"{stem}.toml"
        manifest.write_text((repo / "data_manifests" / f"{stem}.toml").read_text())
        outs[stem] = root / "shards" / stem
        build(manifest, outs[stem], jobs=1, progress=False)
    return outs
