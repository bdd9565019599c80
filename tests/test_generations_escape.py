"""Names read back from a journal or an index never delete anything outside the dataset folder.

A journal or an index is a file in the dataset folder that anyone with write access can edit; a
build and
`shardsmith gc` delete the files they name. Before this guard, `gc` on a folder whose journal named
``../outside/j1.txt`` removed it (and a whole outside folder), and a rebuild did the same for
``retired``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import generations
from pipeline.gc import gc


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


def test_gc_ignores_a_journal_naming_outside_files(tmp_path: Path) -> None:
    ds, outside, names = _victims(tmp_path, link=False)
    (ds / ".build-99999.journal").write_text(json.dumps({"pid": 99999, "files": names}))
    removed = gc(ds)
    assert removed == []
    assert (outside / "j1.txt").read_text() == "keep me"
    assert (outside / "jdir" / "inner.txt").exists()


def test_a_retired_list_naming_outside_files_is_neither_deleted_nor_carried(tmp_path: Path) -> None:
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
