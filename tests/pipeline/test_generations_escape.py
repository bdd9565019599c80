"""Names read back from a journal or an index never delete anything outside the dataset folder.

A journal or an index is a file in the dataset folder that anyone with write access can edit; a
build and `shardsmith gc` delete the files they name. Before this guard, `gc` on a folder whose
journal named ``../outside/j1.txt`` removed it (and a whole outside folder), and a rebuild did
the same for ``retired``. ``test_names_read_back_never_reach_outside`` feeds traversal payloads
through every name a build or gc reads back (journal, ``retired``, a shard's ``file``, the
condition table's ``file``, ``previous``) into a real dataset, then rebuilds and collects it:
nothing outside is deleted or written, and the committed index names only files inside.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import format as fmt
from pipeline import generations
from pipeline.build import build
from pipeline.errors import OutputError
from pipeline.gc import gc
from pipeline.incremental import INPUTS_FILE
from pipeline.verify import verify
from tests import hostile


def _victims(tmp_path: Path, link: bool = True) -> tuple[Path, Path, list[str]]:
    ds, outside = tmp_path / "ds", tmp_path / "outside"
    ds.mkdir()
    (outside / "jdir").mkdir(parents=True)
    (outside / "j1.txt").write_text("keep me")
    (outside / "jdir" / "inner.txt").write_text("keep me too")
    if link:  # a folder of the dataset that is a symlink leading out
        (ds / "link").symlink_to(outside, target_is_directory=True)
    names = [
        "../outside/j1.txt",
        str(outside / "j1.txt"),
        "../outside/jdir",
        "link/j1.txt",
        "sub/../../x",
        "a\\..\\..\\x",
        "",
    ]
    return ds, outside, names


@pytest.mark.parametrize(
    "rel", ["../x", "/etc/passwd", "a/../../x", "link/j1.txt", "", ".", "a\\..\\x"]
)
def test_names_that_leave_the_folder_are_not_inside(tmp_path: Path, rel: str) -> None:
    ds, _, _ = _victims(tmp_path)
    assert not generations.inside(ds, rel)
    assert not generations.remove(ds, rel)


def test_names_inside_are_inside(tmp_path: Path) -> None:
    ds, _, _ = _victims(tmp_path)
    assert generations.inside(ds, "shards/train-000-000-0123456789abcdef")
    assert generations.inside(ds, "conditions-0123456789abcdef.npy")


@hostile.parametrize
def test_gc_ignores_a_journal_naming_outside_files(case: hostile.Case, tmp_path: Path) -> None:
    ds, outside, names = _victims(tmp_path, link=False)
    (ds / ".build-99999.journal").write_text(json.dumps({"pid": 99999, "files": names}))
    removed = gc(ds)
    assert removed == []
    assert (outside / "j1.txt").read_text() == "keep me"
    assert (outside / "jdir" / "inner.txt").exists()


@hostile.parametrize
def test_a_retired_list_naming_outside_files_is_neither_deleted_nor_carried(
    case: hostile.Case, tmp_path: Path
) -> None:
    ds, outside, names = _victims(tmp_path)

    class Prev:  # the fields next_generation and sweep read from an index
        retired = names
        previous = None
        generation = 3
        shards: list = []
        conditions = None

        def files(self) -> list[str]:
            return []

    assert generations.sweep(ds, Prev()) == []  # type: ignore[arg-type]
    assert generations.next_generation(ds, None, [])["retired"] == []
    assert (outside / "j1.txt").exists() and (outside / "jdir").is_dir()


# -- every name read back, through a real build and gc -------------------------------------------
# payload -> (name relative to the dataset folder, name relative to its shards/), both leading to
# OUTSIDE/victim (a folder, like a zarr shard: a delete would be an rmtree)
PAYLOADS = {
    "dotdot": ("../outside/victim", "../../outside/victim"),
    "absolute": ("{outside}/victim", "{outside}/victim"),
    "nested": ("a/../../outside/victim", "a/../../../outside/victim"),
    "link": ("link/victim", "link/victim"),  # link (and shards/link) -> OUTSIDE
}


@pytest.fixture(scope="module")
def built_once(
    tmp_path_factory: pytest.TempPathFactory, small_manifest: Callable[..., Any]
) -> Path:
    """A small perturbation dataset (shards, a condition table), built once, copied per test."""
    root = tmp_path_factory.mktemp("names")
    build(small_manifest(root), root / "ds", jobs=1, progress=False)
    return root


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


def _tamper(out: Path, place: str, rel: str, in_shards: str) -> None:
    """Write the payload into ``place``; an index edit also rewrites .build-inputs.json's index
    hash, so the no-change shortcut trusts the edited index as it would trust a real one."""
    if place == "journal":
        journal = {"pid": 4242, "files": [rel, f"{fmt.SHARDS_DIR}/{in_shards}"]}
        (out / ".build-4242.journal").write_text(json.dumps(journal))
        return
    doc = json.loads(fmt.index_path(out).read_text())
    if place == "retired":
        doc["retired"] = [rel, f"{fmt.SHARDS_DIR}/{in_shards}"]
    elif place == "shard-file":
        doc["shards"][0]["file"] = in_shards
    elif place == "conditions-file":
        doc["conditions"]["file"] = rel
    elif place == "previous":
        doc["previous"] = {
            "generation": 0,
            "index_sha256": "0" * 64,
            "shards": [in_shards],
            "conditions": rel,
        }
    data = json.dumps(doc).encode()
    fmt.index_path(out).write_bytes(data)
    inputs = json.loads((out / INPUTS_FILE).read_text())
    inputs["index_sha256"] = hashlib.sha256(data).hexdigest()
    (out / INPUTS_FILE).write_text(json.dumps(inputs))


@hostile.parametrize
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_names_read_back_never_reach_outside(
    case: hostile.Case, payload: str, built_once: Path, tmp_path: Path
) -> None:
    """Issue 25's deliverable: a rebuild (no-change shortcut, reuse, retire, commit) and ``gc
    --drop-previous`` given a tampered name delete and write nothing outside the dataset, and the
    index they commit names only files inside it."""
    root = tmp_path / "root"
    shutil.copytree(built_once, root, symlinks=True)
    out, outside = root / "ds", root / "outside"  # beside the dataset
    (outside / "victim").mkdir(parents=True)
    (outside / "victim" / "zarr.json").write_text("a user's data")
    (outside / "note.txt").write_text("keep")
    for folder in (out, out / fmt.SHARDS_DIR):  # what "link/..." and "a/../.." go through
        (folder / "link").symlink_to(outside, target_is_directory=True)
        (folder / "a").mkdir()
    rel, in_shards = (p.format(outside=outside) for p in PAYLOADS[payload])
    _tamper(out, case.data, rel, in_shards)
    before = _snapshot(outside)

    build(root / "m.toml", out, jobs=1, progress=False)
    gc(out, drop_previous=True)

    assert _snapshot(outside) == before, "something outside the dataset was deleted or written"
    index = fmt.read_index(out)
    named = [*index.files(), *(index.previous.files() if index.previous else []), *index.retired]
    assert all(generations.inside(out, f) for f in named), named
    assert verify(out) == []


@hostile.parametrize
def test_a_shards_folder_linking_out_is_refused(
    case: hostile.Case, built_once: Path, tmp_path: Path
) -> None:
    """A build writes and deletes shards through ``shards/``: when that is a link leading outside
    --out, the build and gc are refused (exit 2) before writing or deleting anything there."""
    root = tmp_path / "root"
    shutil.copytree(built_once, root, symlinks=True)
    out, outside = root / "ds", root / "outside"  # beside the dataset
    shutil.move(out / fmt.SHARDS_DIR, outside)
    (out / fmt.SHARDS_DIR).symlink_to(outside, target_is_directory=True)
    (root / "m.toml").write_text((root / "m.toml").read_text().replace("seed = 0", "seed = 5"))
    before = _snapshot(outside)
    with pytest.raises(OutputError, match=r"shards/ is a link leading outside the folder") as e:
        build(root / "m.toml", out, jobs=1, progress=False)
    assert str(outside) in str(e.value)
    with pytest.raises(OutputError, match="link leading outside"):
        gc(out, drop_previous=True)
    assert _snapshot(outside) == before
