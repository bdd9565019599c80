"""Hostile or careless manifests are bad input with a clear error naming the key, never a traceback,
and a file is never read twice: one file named by two entries, or reached again through a folder
link that points back up the tree (``src/sub/up -> ..`` under a ``**`` glob), is refused or
skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loaders.plugins import PluginError, load_plugin
from pipeline.errors import ManifestError
from pipeline.manifest import load_manifest
from pipeline.schema import Key, read
from tests import hostile

HEAD = '[dataset]\nname = "h"\nkind = "ct"\n'


def _volumes(root: Path, n: int = 2) -> Path:
    src = root / "src"
    (src / "sub").mkdir(parents=True)
    for k in range(n):
        (src / "sub" / f"v{k}.npy").write_bytes(b"not read by the manifest")
    return src


def _write(root: Path, body: str) -> Path:
    m = root / "m.toml"
    m.write_text(HEAD + body)
    return m


@hostile.parametrize
def test_one_file_named_by_two_entries_is_refused(case: hostile.Case, tmp_path: Path) -> None:
    _volumes(tmp_path)
    m = _write(
        tmp_path, '[[sources]]\npath = "src/sub/v0.npy"\n[[sources]]\npath = "src/**/*.npy"\n'
    )
    with pytest.raises(ManifestError, match=r"sources\[1\]\.path.*already named by sources\[0\]"):
        load_manifest(m)


def test_a_link_to_a_file_read_elsewhere_is_refused(tmp_path: Path) -> None:
    src = _volumes(tmp_path)
    (src / "alias.npy").symlink_to(src / "sub" / "v1.npy")
    m = _write(tmp_path, '[[sources]]\npath = "src/**/*.npy"\n')
    with pytest.raises(ManifestError, match="same real path"):
        load_manifest(m)


@hostile.parametrize
def test_a_folder_link_cycle_under_a_recursive_glob_reads_each_file_once(
    case: hostile.Case, tmp_path: Path
) -> None:
    src = _volumes(tmp_path)
    (src / "sub" / "up").symlink_to("..", target_is_directory=True)
    m = _write(tmp_path, '[[sources]]\npath = "src/**/*.npy"\n')
    files = [s.path.name for s in load_manifest(m).sources]
    assert sorted(files) == ["v0.npy", "v1.npy"]


@hostile.parametrize
@pytest.mark.parametrize("name", ["../../evil", "/abs/mod", "a b", "", "mod.", "1mod"])
def test_a_plugin_that_is_no_module_name_is_bad_input(
    case: hostile.Case, tmp_path: Path, name: str
) -> None:
    _volumes(tmp_path)
    m = _write(tmp_path, f'plugins = ["{name}"]\n[[sources]]\npath = "src/sub/*.npy"\n')
    with pytest.raises(ManifestError, match=r"dataset\.plugins.*not a Python module name"):
        load_manifest(m)
    with pytest.raises(PluginError):
        load_plugin(name)


@hostile.parametrize
def test_a_plugin_with_a_syntax_error_is_bad_input_naming_it(
    case: hostile.Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _volumes(tmp_path)
    (tmp_path / "broken_plugin_mod.py").write_text("def oops(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    m = _write(tmp_path, 'plugins = ["broken_plugin_mod"]\n[[sources]]\npath = "src/sub/*.npy"\n')
    with pytest.raises(ManifestError, match=r"broken_plugin_mod.*SyntaxError"):
        load_manifest(m)


def test_a_toml_nested_too_deep_is_bad_input(tmp_path: Path) -> None:
    m = tmp_path / "deep.toml"
    m.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n" + HEAD)
    with pytest.raises(ManifestError, match="nested too deeply"):
        load_manifest(m)


@pytest.mark.process
@hostile.parametrize
def test_cli_exits_2_without_a_traceback(case: hostile.Case, tmp_path: Path) -> None:
    import subprocess
    import sys

    m = tmp_path / "deep.toml"
    m.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n" + HEAD)
    res = subprocess.run(
        [sys.executable, "-m", "pipeline", "build", str(m), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "nested too deeply" in res.stderr


@pytest.mark.parametrize("name", ["../../../escaped_out", "a/b", "..", ".", "", "/abs", ".hidden"])
def test_a_dataset_name_that_is_no_plain_folder_name_is_refused(tmp_path: Path, name: str) -> None:
    _volumes(tmp_path)
    m = tmp_path / "m.toml"
    m.write_text(f'[dataset]\nname = "{name}"\nkind = "ct"\n[[sources]]\npath = "src/sub/*.npy"\n')
    with pytest.raises(ManifestError, match=r"dataset\.name.*not a plain name"):
        load_manifest(m)


@pytest.mark.process
@hostile.parametrize
def test_build_without_out_never_writes_outside_shards(case: hostile.Case, tmp_path: Path) -> None:
    import subprocess
    import sys

    _volumes(tmp_path)
    (tmp_path / "m.toml").write_text(
        f'[dataset]\nname = "{case.data}"\nkind = "ct"\n[[sources]]\npath = "src/sub/*.npy"\n'
    )
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    res = subprocess.run(
        [sys.executable, "-m", "pipeline", "build", str(tmp_path / "m.toml")],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "dataset.name" in res.stderr, res.stderr
    assert not (tmp_path / "escaped_out").exists() and not (work / "shards").exists()


def test_a_list_of_names_refuses_an_empty_name_and_a_list_of_labels_keeps_it(
    tmp_path: Path,
) -> None:
    """A "names" key (columns, obsm keys, spike images) refuses "" and "  ", bare or listed; a
    "strings" key (labels, where "" can be a value) keeps them (pipeline.schema.read)."""
    m = tmp_path / "m.toml"
    names, strings = Key("names", ()), Key("strings", ())
    for key, value in (("a", ""), ("b", ["x", "  "])):
        with pytest.raises(ManifestError, match=rf"\[fields\.{key}\] has an empty name"):
            read(m, "fields", {key: value}, {key: names})
    assert read(m, "fields", {"c": "x"}, {"c": names, "absent": names}) == {
        "c": ("x",),
        "absent": (),
    }
    assert read(m, "fields", {"d": ""}, {"d": strings}) == {"d": ("",)}


@pytest.mark.parametrize(
    ("body", "key", "problem"),
    [
        ("[ct]\nwindw = 'lung'\n", "ct.windw", "unknown key; did you mean 'window'?"),
        ("[split]\ngruop = 'file'\n", "split.gruop", "unknown key; did you mean 'group'?"),
        ("[ct]\nwindow = 'lnug'\n", "ct.window", "did you mean 'lung'?"),
        ("[ct]\nmin_points = '100'\n", "ct.min_points", "expected an integer, got str '100'"),
        ("ct = 3\n", "ct", "must be a table"),  # was a TypeError traceback
        ("[ct]\norientation = false\n", "ct.orientation", "expected a string, got a boolean"),
    ],
)
def test_a_careless_key_is_refused_naming_it_and_the_nearest_known_one(
    tmp_path: Path, body: str, key: str, problem: str
) -> None:
    _volumes(tmp_path)
    text = HEAD + '[[sources]]\npath = "src/sub/*.npy"\n'
    m = tmp_path / "m.toml"
    m.write_text(body + text if not body.startswith("[") else text + body)
    with pytest.raises(ManifestError) as e:
        load_manifest(m)
    assert (e.value.key, str(m)) == (key, e.value.manifest) and problem in e.value.problem
