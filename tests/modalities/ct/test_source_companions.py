"""Every file a record's bytes or metadata come from is part of its source's fingerprint (a
``.npy``'s sidecar, an ``.nhdr``'s data file, a DICOM series' slices, a spike frame's paired
images; a perturbation feature table is an input of the condition table): editing one after a build
rewrites exactly the shards that depend on it, in ``--dry-run`` and with ``--rehash`` too. And an
``.nhdr`` may not read a data file outside its folder unless the manifest allows it, nor one
longer than its header promises. The cases are the rows of ``tests/hostile/stale_inputs.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaders import format as fmt
from pipeline.build import build
from pipeline.errors import SourceError
from pipeline.modalities.ct.demo import make_chest_volume
from pipeline.modalities.ct.writers import chest_affine, write_dicom_series, write_nrrd
from tests import hostile

AFFINE = chest_affine((0.7, 0.8, 2.5), (10.0, 20.0, -30.0))
Edit = Callable[[], str]  # applies the edit; returns the edited source's file name


def _volumes() -> tuple[np.ndarray, np.ndarray]:
    return make_chest_volume((40, 36, 12), 3)[0], make_chest_volume((40, 36, 12), 4)[0]


def _keep_stat(path: Path, write: Callable[[], None]) -> None:
    """``write()``, then ``path``'s size and mtime as they were (only its ctime tells)."""
    st = path.stat()
    write()
    assert path.stat().st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _npy(root: Path, ct: Any, edit: str) -> tuple[Path, Edit]:
    a, b = _volumes()
    (root / "v").mkdir()
    np.save(root / "v" / "a.npy", a)
    np.save(root / "v" / "b.npy", b)
    side = root / "v" / "a.json"
    if edit != "sidecar-added":
        side.write_text(json.dumps({"spacing": [0.7, 0.7, 2.5]}))

    def apply() -> str:
        if edit == "sidecar-removed":
            side.unlink()
        else:
            side.write_text(json.dumps({"spacing": [0.5703125, 0.5703125, 5.0]}))
        return "a.npy"

    return ct.manifest(root, ['path = "v/*.npy"']), apply


def _nhdr(root: Path, ct: Any, edit: str) -> tuple[Path, Edit]:
    a, b = _volumes()
    write_nrrd(root / "v" / "h.nhdr", a, AFFINE, encoding="raw")
    write_nrrd(root / "v" / "k.nhdr", b, AFFINE, encoding="raw")
    raw = root / "v" / "h.raw"

    def apply() -> str:
        data = np.fromfile(raw, np.int16)
        data[data == data.min()] += 1  # air a unit up: a different volume, the same size
        _keep_stat(raw, lambda: data.tofile(raw))
        return "h.nhdr"

    return ct.manifest(root, ['path = "v/*.nhdr"']), apply


def _dicom(root: Path, ct: Any, edit: str) -> tuple[Path, Edit]:
    pydicom = pytest.importorskip("pydicom")
    a, b = _volumes()
    write_dicom_series(root / "s" / "one", a, AFFINE, seed=1)
    write_dicom_series(root / "s" / "two", b, AFFINE, seed=2)

    def apply() -> str:
        first = sorted((root / "s" / "one").iterdir())[3]
        ds = pydicom.dcmread(first)
        px = ds.pixel_array.copy()
        px[px == px.min()] += 1
        ds.PixelData = px.tobytes()
        ds.save_as(first)
        return "one"

    return ct.manifest(root, ['path = "s/*"\ntype = "dicom"']), apply


def _spike(root: Path, ct: Any, edit: str) -> tuple[Path, Edit]:
    pytest.importorskip("PIL")
    from pipeline.modalities.spike.demo import write_spike_demo

    write_spike_demo(root / "data")
    repo = Path(__file__).resolve().parents[3]
    text = (repo / "data_manifests" / "demo_spike.toml").read_text()
    m = root / "m" / "spike.toml"
    m.parent.mkdir()
    m.write_text(text.replace("../data/demo/spike", "../data/spike"))
    sharp = sorted((root / "data" / "spike" / "train" / "seq02" / "sharp").iterdir())[2]

    def apply() -> str:
        import PIL.Image

        img = np.asarray(PIL.Image.open(sharp)).copy()
        img[0, 0] = 255 - img[0, 0]  # one pixel of one paired image
        PIL.Image.fromarray(img).save(sharp)
        return sharp.stem + ".dat"

    return m, apply


SETUPS = {"npy": _npy, "nhdr": _nhdr, "dicom": _dicom, "spike": _spike}


def _by_source(out: Path) -> dict[str, set[str]] | None:
    """Source file name -> the shard files holding its records; None when shards mix sources (a
    spike dataset: frames of several files a shard)."""
    index = fmt.read_index(out)
    names = {i: Path(s["path"]).name for i, s in enumerate(index.sources)}
    files: dict[str, set[str]] = {n: set() for n in names.values()}
    ct = index.sections.get("ct")
    if ct is not None:  # CT: a shard's records name their volumes
        for shard, recs in ct["records"].items():
            for r in recs:
                files[r["file"]].add(shard)
        return files
    if any(e.source not in names for e in index.shards):
        return None
    for e in index.shards:  # one source a shard
        files[names[e.source]].add(e.file)
    return files


@hostile.parametrize
def test_an_edited_companion_rewrites_its_shards_only(
    case: hostile.Case,
    tmp_path: Path,
    ct: Any,
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Any],
) -> None:
    kind, edit = case.data
    if kind == "h5ad":
        return _perturbation(tmp_path, build_dataset, write_manifest)
    manifest, apply = SETUPS[kind](tmp_path, ct, edit)
    text = manifest.read_text()  # one CT volume a shard: which shards a source feeds is clear
    manifest.write_text(text.replace("shard_size_mb = 0.05", "shard_size_mb = 0.001"))
    out = tmp_path / "out"
    first = build(manifest, out, jobs=1, progress=False)
    assert not build(manifest, out, jobs=1, progress=False).changed
    before = _by_source(out)
    name = apply()
    plan = build(manifest, out, jobs=1, progress=False, dry_run=True).difference
    assert plan is not None and plan.changed, f"{case.id}: --dry-run sees no change"
    again = build(manifest, out, jobs=1, progress=False, rehash=(edit == "sidecar-edited"))
    assert set(plan.write) == set(again.written), "the dry run and the build disagree"
    assert again.changed and again.written and again.reused, f"{case.id}: {again}"
    if before is not None:  # exactly the edited source's shards are rewritten
        stale = before[name]
        assert stale and stale.isdisjoint(again.reused), f"{case.id}: a stale shard was reused"
        untouched = set().union(*(fs for n, fs in before.items() if not fs & stale))
        assert untouched and untouched <= set(again.reused), f"{case.id}: unaffected rewritten"
        assert (_by_source(out) or {})[name] and set(first.written) != set(again.written)
    if kind == "npy":
        spacing = _record(out, name).get("spacing")
        want = {"sidecar-removed": None, "sidecar-edited": [0.5703125, 0.5703125, 5.0]}
        assert spacing == want.get(edit, [0.5703125, 0.5703125, 5.0]), spacing
    assert not build(manifest, out, jobs=1, progress=False).changed


def _record(out: Path, name: str) -> dict[str, Any]:
    recs = fmt.read_index(out).section("ct")["records"]
    rec = next(r for rs in recs.values() for r in rs if r["file"] == name)
    geometry = rec.get("geometry") or {}
    return {"spacing": geometry.get("spacing", rec.get("spacing"))}


def _perturbation(
    tmp_path: Path, build_dataset: Callable[..., Any], write_manifest: Callable[..., Any]
) -> None:
    """The feature table feeds the condition table (its vectors), not the cell shards."""
    import anndata as ad

    paths = build_dataset(tmp_path, "sources", sources=2, cells=200).sources
    labels = {str(x) for p in paths for x in ad.read_h5ad(p).obs["perturbation"]}
    names = sorted(labels - {"control"})
    np.savez(
        tmp_path / "feats.npz", **{n: np.full(3, i + 1, np.float32) for i, n in enumerate(names)}
    )
    manifest = write_manifest(tmp_path / "m.toml")
    manifest.write_text(
        manifest.read_text().replace(
            'values = "counts"', 'values = "counts"\nperturbation_features = "feats.npz"'
        )
    )
    out = tmp_path / "out"
    first = build(manifest, out, jobs=1, progress=False)
    table = fmt.read_index(out).conditions
    assert table is not None
    np.savez(tmp_path / "feats.npz", **{n: np.full(3, -i, np.float32) for i, n in enumerate(names)})
    again = build(manifest, out, jobs=1, progress=False)
    assert again.changed and set(again.reused) == set(first.written) and not again.written
    now = fmt.read_index(out).conditions
    assert now is not None and now.digest != table.digest


# -- item 6: an .nhdr's data file ----------------------------------------------------------------
@hostile.parametrize
def test_an_nhdr_reading_outside_its_folder_is_refused(
    case: hostile.Case, tmp_path: Path, ct: Any
) -> None:
    a, _ = _volumes()
    header = write_nrrd(tmp_path / "v" / "h.nhdr", a, AFFINE, encoding="raw")
    raw = tmp_path / "v" / "h.raw"
    if case.data == "longer":
        raw.write_bytes(raw.read_bytes() + b"\0" * 64)
        with pytest.raises(SourceError, match=r"h\.raw.*holds \d+ bytes.*promises"):
            build(ct.manifest(tmp_path, ['path = "v/*.nhdr"']), tmp_path / "out", progress=False)
        return
    secret = tmp_path / "outside" / "secret.raw"
    secret.parent.mkdir()
    raw.rename(secret)
    name = "../outside/secret.raw" if case.data == "parent" else str(secret)
    text = header.read_text()
    header.write_text(
        "\n".join(
            f"data file: {name}" if line.startswith("data file:") else line
            for line in text.splitlines()
        )
        + "\n"
    )
    m = ct.manifest(tmp_path, ['path = "v/*.nhdr"'])
    with pytest.raises(
        SourceError, match=r"h\.nhdr.*outside the header's folder.*allow_outside_data"
    ):
        build(m, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "index.json").exists()
    allowed = ct.manifest(tmp_path, ['path = "v/*.nhdr"'], extra="allow_outside_data = true")
    assert build(allowed, tmp_path / "out", progress=False).written
