"""The stat cache (pipeline.fingerprint): a nightly rebuild reads no unchanged source to digest it;
a source rewritten with its size and mtime kept (``touch -d``, ``cp -p``) is still read again,
caught by its ctime or inode; ``--rehash`` reads every source again."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.build import build
from pipeline.cli import main
from pipeline.fingerprint import HASHED, fingerprint
from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from tests import hostile


def _read_while(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the source bytes read to digest sources meanwhile."""
    before = HASHED.bytes
    result = fn()
    return result, HASHED.bytes - before


@pytest.fixture
def built(tmp_path: Path, write_manifest: Callable[..., Any]) -> tuple[Path, list[Path], Path]:
    """Two sources and a manifest over them, built once: (manifest, sources, out)."""
    src = tmp_path / "src"
    paths = [
        write_perturb_h5ad(src / f"screen_{i}.h5ad", n_cells=200, n_genes=40, n_perts=4, seed=i)
        for i in range(2)
    ]
    manifest = write_manifest(tmp_path / "m.toml")
    build(manifest, tmp_path / "out", jobs=1, progress=False)
    return manifest, paths, tmp_path / "out"


def _rebuild(manifest: Path, out: Path, **kw: Any) -> Any:
    return build(manifest, out, jobs=1, progress=False, **kw)


def test_an_unchanged_rebuild_reads_no_source(built: tuple[Path, list[Path], Path]) -> None:
    manifest, _, out = built
    res, read = _read_while(lambda: _rebuild(manifest, out))
    assert read == 0 and not res.changed


@hostile.parametrize
def test_same_size_and_mtime_but_rewritten_is_read_again(
    case: hostile.Case,
    built: tuple[Path, list[Path], Path],
) -> None:
    """Only the source whose ctime changed is read again; its bytes are the same, so its shards
    (same plan keys) are reused."""
    manifest, paths, out = built
    st = paths[0].stat()
    paths[0].write_bytes(paths[0].read_bytes())  # same bytes, written again: new mtime and ctime
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back; ctime cannot be
    res, read = _read_while(lambda: _rebuild(manifest, out))
    assert read == st.st_size and res.written == []


@hostile.parametrize
def test_a_replaced_file_is_read_again(
    case: hostile.Case, built: tuple[Path, list[Path], Path]
) -> None:
    """``cp -p`` over the source's name: same size and mtime, another inode."""
    manifest, paths, out = built
    copy = paths[1].with_name("copy.tmp")
    shutil.copy2(paths[1], copy)
    os.replace(copy, paths[1])
    _, read = _read_while(lambda: _rebuild(manifest, out))
    assert read == paths[1].stat().st_size


def test_rehash_reads_every_source(built: tuple[Path, list[Path], Path]) -> None:
    manifest, paths, out = built
    total = sum(p.stat().st_size for p in paths)
    res, read = _read_while(lambda: _rebuild(manifest, out, rehash=True))
    assert read == total and res.written == []
    args = ["build", str(manifest), "--out", str(out), "--no-progress", "--quiet"]
    code, read = _read_while(lambda: main([*args, "--rehash"]))
    assert code == 0 and read == total
    code, read = _read_while(lambda: main(args))
    assert code == 0 and read == 0


@hostile.parametrize
def test_a_content_change_keeping_size_and_mtime_gives_another_digest(
    case: hostile.Case, tmp_path: Path
) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    first = fingerprint(path)
    cache = {str(path): first.stat_json()}
    again, read = _read_while(lambda: fingerprint(path, cache))
    assert again == first and read == 0
    st = path.stat()
    path.write_bytes(b"b" * 1000)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed, read = _read_while(lambda: fingerprint(path, cache))
    assert read == 1000 and changed.digest != first.digest
    assert (changed.size, changed.mtime_ns) == (first.size, first.mtime_ns)


@hostile.parametrize
def test_a_sha256_entry_is_digested_again(case: hostile.Case, tmp_path: Path) -> None:
    """A stat cache entry of another algorithm (an older build's sha256) is not reused."""
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 100)
    entry = dict(fingerprint(path).stat_json(), digest="sha256:" + "0" * 64)
    fp, read = _read_while(lambda: fingerprint(path, {str(path): entry}))
    assert read == 100 and fp.digest.startswith("xxh3_128:")
