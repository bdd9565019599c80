"""docs/EXTENDING.md runs as written, the way a plug-in author runs it: its files saved outside the
repository, each documented command in a process of its own. Why separate processes: a dataset
whose plug-in is imported only by the process that built it opens there and nowhere else (the bug
of a build that did not record its plug-ins in index.json: `verify` in a fresh shell said "unknown
sample type")."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "EXTENDING.md"
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```\s*$", re.S | re.M)
NAMED = re.compile(r"\A# (?P<path>[\w./-]+)\n")  # a block whose first line names the file it is
LABELS = ("chair", "lamp", "table")
Done = subprocess.CompletedProcess[str]


def doc_blocks() -> list[tuple[str, str]]:
    return [(m.group("lang"), m.group("body")) for m in FENCE.finditer(DOC.read_text())]


def doc_files() -> dict[str, str]:
    """path -> text of every python and toml block that names its file on its first line."""
    out = {}
    for lang, body in doc_blocks():
        m = NAMED.match(body)
        if lang in ("python", "toml") and m:
            out[m.group("path")] = body
    return out


def doc_commands() -> list[str]:
    (bash,) = [body for lang, body in doc_blocks() if lang == "bash"]
    return [line.split("  #")[0].strip() for line in bash.splitlines() if line.strip()]


def _env(*folders: Path) -> dict[str, str]:
    """``folders`` on PYTHONPATH, then this checkout (what a package install would provide)."""
    path = os.pathsep.join([*map(str, folders), str(ROOT)])
    return {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}


def _argv(command: str) -> list[str]:
    """A documented command line with this interpreter: `shardsmith` is the installed console script
    when there is one (it does not put the working folder on sys.path, as `python -m` would)."""
    args = shlex.split(command)
    script = Path(sys.executable).with_name("shardsmith")
    if args[0] == "shardsmith":
        head = [str(script)] if script.exists() else [sys.executable, "-m", "pipeline"]
        return head + args[1:]
    assert args[0] == "python", command
    return [sys.executable, *args[1:]]


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def write_example(folder: Path, manifest_edit: tuple[str, str] = ("", "")) -> Path:
    """The doc's files (but pyproject.toml) and twelve clouds under ``folder``; cloud 11 has one
    point."""
    for name, text in doc_files().items():
        if name != "pyproject.toml":
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            edited = text.replace(*manifest_edit) if name == "clouds.toml" else text
            (folder / name).write_text(edited)
    (folder / "clouds").mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):  # 4 scenes; cloud 11 has one point: skipped by min_points = 2
        n = 1 if i == 11 else int(rng.integers(2, 9))
        doc = {
            "scene": f"s{i % 4}",
            "label": LABELS[i % 3],
            "points": rng.standard_normal((n, 3)).round(3).tolist(),
        }
        (folder / "clouds" / f"{i:02d}.pts.json").write_text(json.dumps(doc))
    return folder


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Done]]:
    """The doc's commands, in order, each in a fresh process, as the doc says (PYTHONPATH=$PWD)."""
    folder = write_example(tmp_path_factory.mktemp("outside-the-repo"))
    done = {}
    for command in doc_commands():
        if command.startswith("export "):
            assert command.split("#")[0].split() == ["export", "PYTHONPATH=$PWD"], command
            continue
        done[command] = _run(_argv(command), folder, _env(folder))
        if done[command].returncode != 0:
            break  # the rest depend on it
    return folder, done


def _say(p: subprocess.CompletedProcess[str]) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"


def test_every_block_is_a_file_or_the_commands() -> None:
    """So that every snippet runs: a python or toml block names its file, and the bash block uses
    them."""
    named = doc_files()
    for lang, body in doc_blocks():
        assert lang == "bash" or NAMED.match(body), f"a {lang} block naming no file:\n{body[:200]}"
    assert {
        "pointclouds/__init__.py",
        "pointclouds/build.py",
        "clouds.toml",
        "train.py",
        "test_pointclouds.py",
        "pyproject.toml",
    } <= set(named)
    reader = named["pointclouds/__init__.py"]
    assert "pipeline" not in re.findall(r"^(?:from|import) (\w+)", reader, re.M)
    assert re.search(r'^BUILD_MODULE = "pointclouds\.build"', reader, re.M)
    assert "import pointclouds" not in named["train.py"].replace("`import pointclouds`", "")
    commands = " ".join(doc_commands())
    assert "train.py" in commands and "test_pointclouds.py" in commands


@pytest.mark.process
def test_the_read_side_imports_neither_torch_nor_the_pipeline(tmp_path: Path) -> None:
    """What the doc promises of pointclouds/__init__.py, which every reader process imports."""
    folder = write_example(tmp_path)
    code = (
        "import sys, pointclouds, loaders.samples as s; s.get_sample_type('clouds'); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'pipeline'}))"
    )
    p = _run([sys.executable, "-c", code], folder, _env(folder))
    assert p.returncode == 0 and p.stdout.split("\n")[-2] == "[]", _say(p)


@pytest.mark.process
def test_each_documented_command_succeeds_in_a_fresh_process(
    walkthrough: tuple[Path, dict],
) -> None:
    folder, done = walkthrough
    assert [c.split()[:2] for c in done] == [
        ["shardsmith", "build"],
        ["shardsmith", "verify"],
        ["shardsmith", "inspect"],
        ["shardsmith", "report"],
        ["python", "train.py"],
        ["python", "-m"],
    ]
    for command, p in done.items():
        assert p.returncode == 0, f"{command}: {_say(p)}"
        assert "Traceback" not in p.stderr, f"{command}: {_say(p)}"
    index = json.loads((folder / "shards" / "clouds" / "index.json").read_text())
    assert index["plugins"] == ["pointclouds"]  # what a fresh process imports to read it
    assert index["stats"]["skipped"] == {"too few points": 1}
    assert index["vocabularies"]["label"] == list(LABELS)
    verify, inspect, tests = (
        done[c] for c in doc_commands() if c.split()[1] in ("verify", "inspect", "-m")
    )
    assert verify.stdout.strip().endswith("OK")
    assert "plug-ins (imported to read it): pointclouds" in inspect.stdout
    # the plug-in's own report section, counted from its shards: every cloud under its label
    page = json.loads((folder / "clouds.json").read_text())["sections"]["Point clouds"]
    per_label = page["clouds_per_label"]["data"]
    assert sorted(per_label) == sorted(LABELS)
    assert sum(per_label.values()) == sum(e["records"] for e in index["shards"])
    # the conformance tests ran, those with the doc's references included
    assert "passed" in tests.stdout and "skipped" not in tests.stdout, _say(tests)


@pytest.mark.process
def test_a_missing_plugin_is_a_clear_error(
    walkthrough: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the plug-in is not importable, every reader says which module is missing and how to get
    it: the CLI with a non-zero exit and no traceback, ShardDataset with a PluginError."""
    from loaders import ShardDataset
    from loaders.plugins import PluginError

    folder, done = walkthrough
    assert all(p.returncode == 0 for p in done.values())
    # a copy away from pointclouds/, read with only this checkout on the path
    data = shutil.copytree(folder / "shards" / "clouds", tmp_path / "clouds")
    for command in ("verify", "inspect", "gc"):  # allowed, but not importable
        p = _run([*_argv("shardsmith"), command, str(data), "--trust-plugins"], tmp_path, _env())
        assert p.returncode != 0, f"{command}: {_say(p)}"
        assert "'pointclouds'" in p.stderr and "PYTHONPATH" in p.stderr, f"{command}: {_say(p)}"
        assert "Traceback" not in p.stderr + p.stdout, f"{command}: {_say(p)}"
    monkeypatch.setitem(sys.modules, "pointclouds", None)  # not importable in this process either
    with pytest.raises(PluginError, match=r"needs the plug-in module 'pointclouds'.*pip install"):
        ShardDataset(data, split="train", sample="clouds", trust_plugins=["pointclouds"])


@pytest.mark.process
def test_a_plugin_on_sys_path_reaches_the_decoder_process(walkthrough: tuple[Path, dict]) -> None:
    """A trainer that puts the plug-in's folder on sys.path itself (a notebook) and never imports
    it: the decoder process, a fresh interpreter, finds the plug-in the index names there too."""
    folder, done = walkthrough
    assert all(p.returncode == 0 for p in done.values())
    code = (
        f"import sys, time\nsys.path.insert(0, {str(folder)!r})\n"
        "from loaders import ShardDataset\nfrom loaders.engine.decoder import Decoder\n"
        f"ds = ShardDataset({str(folder / 'shards' / 'clouds')!r}, sample='clouds', "
        "trust_plugins=True)\n"
        "d = Decoder(ds.reader.spec)\nt = time.time()\n"
        "while not d.ready() and time.time() - t < 120:\n    time.sleep(0.05)\n"
        "d.close()\nprint('ready')\n"
    )
    p = _run([sys.executable, "-c", code], ROOT, _env())
    assert p.returncode == 0 and p.stdout.strip() == "ready", _say(p)


@pytest.mark.process
def test_an_installed_plugin_is_found_through_its_entry_point(tmp_path: Path) -> None:
    """The doc's pyproject.toml entry point, installed (a dist-info folder on the path, as pip
    writes it), finds the plug-in with no `plugins` in the manifest, in every process; the index
    then names none."""
    folder = write_example(tmp_path, ('plugins = ["pointclouds"]', ""))
    pyproject = tomllib.loads(doc_files()["pyproject.toml"])
    group = pyproject["project"]["entry-points"]["shardsmith.modalities"]
    dist = folder / "pointclouds-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pointclouds\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[shardsmith.modalities]\n" + "".join(f"{k} = {v}\n" for k, v in group.items())
    )
    env = _env(folder)
    read = (
        "python -c 'from loaders import ShardDataset as D; "
        'print(sum(len(b["label"]) for b in D("shards/clouds", sample="clouds")))\''
    )
    for command in (
        "shardsmith build clouds.toml --out shards/clouds",
        "shardsmith verify shards/clouds",
        read,
    ):
        p = _run(_argv(command), folder, env)
        assert p.returncode == 0, f"{command}: {_say(p)}"
    assert "plugins" not in json.loads((folder / "shards" / "clouds" / "index.json").read_text())
    assert int(p.stdout.split()[-1]) > 0


def test_the_index_names_plugins_only_when_there_are_some(tmp_path: Path) -> None:
    """An index without plug-ins keeps its bytes (no empty key), and `plugins` reads back as
    written."""
    from loaders import format as fmt

    index = fmt.Index(
        root=tmp_path, name="x", kind="k", encoding="zarr", fields=[], tables=[], shards=[]
    )
    assert "plugins" not in index.to_json()
    fmt.write_index(index)
    assert fmt.read_index(tmp_path).plugins == []
    named = fmt.Index(**{**index.__dict__, "plugins": ["json"]})  # any importable module will do
    doc, plain = named.to_json(), index.to_json()
    assert doc.pop("plugins") == ["json"] and doc.pop("digest") != plain.pop("digest")
    assert doc == plain  # the digest covers `plugins` (index version 5): the only other change
    fmt.write_index(named)
    assert fmt.read_index(tmp_path).plugins == ["json"]
