"""Opening a dataset you did not build (issue 45, items 1-3): an ``index.json`` that names files
outside the folder, plug-in modules to import, or no digest. Each hostile index is re-sealed (its
digest recomputed, as an attacker can) unless the case is about the digest, and is opened as a
local folder and from a real S3 server (moto): nothing is written outside the dataset and cache
folders, and nothing is imported, unless the caller allowed it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardDataset, ShardLoader
from loaders import format as fmt
from loaders.plugins import TRUST_ENV, PluginError
from pipeline.cli import main
from tests import hostile

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
WHERE = [pytest.param("local", id="local"), pytest.param("s3", id="s3", marks=pytest.mark.s3)]
PAYLOAD = "import pathlib, os\npathlib.Path(os.environ['ZZ_MARKER']).write_text('ran')\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_dataset: Callable[..., Any]) -> Path:
    return build_dataset(
        tmp_path_factory.mktemp("untrusted"), formats=("tar",), sources=1, n_shards=2
    ).out


@pytest.fixture
def open_hostile(
    built: Path, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., str]:
    """``open_hostile(where, edit, seal=True)``: a copy of the dataset whose index.json ``edit``
    changed (re-sealed unless ``seal`` is False), as a local folder or pushed to S3 (the original
    pushed, then the hostile index.json put over it); returns what a reader opens."""
    monkeypatch.setenv(TRUST_ENV, "")  # no allowance from the environment (restored after)
    monkeypatch.setenv("SHARDSMITH_CACHE", str(tmp_path / "cache"))  # the commands' cache
    monkeypatch.chdir(tmp_path)

    def make(where: str, edit: Callable[[dict[str, Any]], None], seal: bool = True) -> str:
        root = tmp_path / "ds"
        shutil.copytree(built, root)
        raw = json.loads(fmt.index_path(root).read_text())
        edit(raw)
        if seal:
            raw["digest"] = fmt.index_digest(raw)
        data = json.dumps(raw).encode()
        if where == "local":
            fmt.index_path(root).write_bytes(data)
            return str(root)
        from loaders.remote.store import open_store
        from pipeline.push import push

        url = f"{request.getfixturevalue('s3_bucket')}/ds"
        push(built, url, progress=False)
        open_store(url).put("index.json", data)
        return url

    return make


def _files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")) if folder.exists() else []


# -- item 1: names that leave the folder ----------------------------------------------------------
@pytest.mark.process  # a case that opens reads through the decoder process
@hostile.parametrize
@pytest.mark.parametrize("where", WHERE)
def test_a_name_leaving_the_folder_refuses_the_dataset(
    case: hostile.Case, where: str, open_hostile: Callable[..., str], tmp_path: Path
) -> None:
    """``case.data``: (the key edited, the name: ``{outside}`` is a folder beside the cache)."""
    key, template = case.data
    outside = tmp_path / "outside"
    name = template.format(outside=outside, up="../" * 16, rel=str(outside).lstrip("/"))

    def edit(raw: dict[str, Any]) -> None:
        if key == "shards[].file":
            raw["shards"][0]["file"] = name
        else:
            raw["conditions"]["file"] = name

    target = open_hostile(where, edit)
    cache = tmp_path / "cache"
    with pytest.raises(fmt.FormatError, match=re.escape(f"{key} = ")) as e:
        ds = ShardDataset(target, cache_dir=cache) if where == "s3" else ShardDataset(target)
        next(iter(ShardLoader(ds)))  # today's code opened it: reading downloads the shard
    assert "not a plain file name" in str(e.value) and "index.json" in str(e.value)
    # `inspect` reads index.json only (and, for a URL, the condition table beside it)
    code = main(["inspect", target, "-q"])
    assert code == 2
    assert _files_under(outside) == [], "a file was written outside the cache"


# -- item 2: plug-in modules an index names ------------------------------------------------------
@hostile.parametrize
@pytest.mark.parametrize("where", WHERE)
def test_a_plugin_the_caller_did_not_allow_is_never_imported(
    case: hostile.Case,
    where: str,
    open_hostile: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``case.data``: the module names index.json's ``plugins`` is given."""
    (module,) = case.data
    monkeypatch.delitem(sys.modules, module, raising=False)
    target = open_hostile(where, lambda raw: raw.__setitem__("plugins", [module]))
    kw = {"cache_dir": tmp_path / "cache"} if where == "s3" else {}
    with pytest.raises(PluginError, match=r"trust_plugins=True.*--trust-plugins.*TRUST_PLUGINS"):
        ShardDataset(target, **kw)
    capsys.readouterr()
    assert main(["inspect", target, "-q"]) == 2
    err = capsys.readouterr().err
    assert f"names the plug-in module(s) {module}" in err and "--trust-plugins" in err, err
    assert module not in sys.modules, f"{module} was imported"
    assert not (tmp_path / "venv").exists(), "venv.__main__ ran: a venv was made in the cwd"


@pytest.mark.parametrize("where", WHERE)
def test_an_allowed_plugin_is_imported_and_passed_on(
    where: str, open_hostile: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side of the allowance: a module the caller names is imported, and the allowance
    is in the environment the decoder process and the workers inherit."""
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "zz_payload.py").write_text(PAYLOAD)
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setenv("ZZ_MARKER", str(tmp_path / "marker"))
    monkeypatch.delitem(sys.modules, "zz_payload", raising=False)
    target = open_hostile(where, lambda raw: raw.__setitem__("plugins", ["zz_payload"]))
    kw: dict[str, Any] = {"cache_dir": tmp_path / "cache"} if where == "s3" else {}
    with pytest.raises(PluginError, match="zz_payload"):
        ShardDataset(target, **kw)
    assert not (tmp_path / "marker").exists()
    ds = ShardDataset(target, trust_plugins=["zz_payload"], decode_process=False, **kw)
    assert (tmp_path / "marker").read_text() == "ran"
    assert "zz_payload" in os.environ[TRUST_ENV].split(",")  # what the processes it starts see
    assert next(iter(ShardLoader(ds))) is not None


# -- item 2 (digest) and item 3: the digest ------------------------------------------------------
@hostile.parametrize
@pytest.mark.parametrize("where", WHERE)
def test_an_unsealed_index_of_the_current_version_is_refused(
    case: hostile.Case, where: str, open_hostile: Callable[..., str], tmp_path: Path
) -> None:
    """``case.data``: "plugins" (a module added to ``plugins`` without sealing again; ``json`` is
    imported already, so only the digest stands in the way) or "no-digest" (the digest removed)."""

    def edit(raw: dict[str, Any]) -> None:
        if case.data == "plugins":
            raw["plugins"] = ["json"]
        else:
            del raw["digest"]

    target = open_hostile(where, edit, seal=False)
    kw = {"cache_dir": tmp_path / "cache"} if where == "s3" else {}
    want = "'plugins' differ" if case.data == "plugins" else "index version 5 without its content"
    with pytest.raises(fmt.FormatError, match=want):
        ShardDataset(target, **kw)


# -- item 1, defence in depth: names that reach the node cache some other way ---------------------
class _Listing:
    """A store whose listing of a zarr shard holds one key that leaves its folder."""

    url = "s3://fake/ds"

    def list(self, prefix: str = "") -> list[Any]:
        from loaders.remote.store import ObjectInfo

        return [ObjectInfo(f"{prefix}zarr.json", 2), ObjectInfo(f"{prefix}../../../../zz.pth", 2)]

    def key_url(self, key: str) -> str:
        return f"{self.url}/{key}"

    def get_to_file(self, key: str, path: Any) -> int:
        Path(path).write_bytes(b"{}")
        return 2


@hostile.parametrize
def test_a_name_reaching_the_cache_another_way_stays_inside(
    case: hostile.Case, tmp_path: Path
) -> None:
    """``case.data``: "pin" (a pin file planted under ``.pins/`` naming ``../`` x 4 + a victim,
    then an eviction), "listing" (a zarr shard's object listing naming ``../`` x 4), "entry" (a
    shard entry built in code, past the index parser)."""
    from urllib.parse import quote

    from loaders.format.values import ShardEntry
    from loaders.remote.cache import CacheError, NodeCache
    from loaders.remote.download import download_tree
    from loaders.remote.ledger import evict
    from loaders.remote.store import RemoteError

    cache_dir, outside = tmp_path / "cache", tmp_path / "outside"
    root = cache_dir / "u" / "d"
    for sub in (".pins", "shards"):  # as a NodeCache lays it out
        (root / sub).mkdir(parents=True)
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("a user's file")
    if case.data == "pin":
        name = quote(f"../../../../{outside.name}/{victim.name}", safe="")  # to tmp_path
        (root / ".pins" / f"{name}.pin").write_text("100")
        evict(cache_dir, 0)
        assert victim.read_text() == "a user's file"
    elif case.data == "listing":
        with pytest.raises(RemoteError, match=r"zz\.pth: is no object of the dataset file"):
            download_tree(_Listing(), "shards/x.zarr", root / ".tmp" / "x", True, "test")  # type: ignore[arg-type]
        assert not (tmp_path / "zz.pth").exists() and not (cache_dir / "zz.pth").exists()
    else:
        cache = NodeCache("s3://fake/ds", root, cache_dir, "tar")
        bad = ShardEntry(f"../../../{outside.name}/{victim.name}", "train", 1, {}, 1, 1, "", "k")
        with pytest.raises(CacheError, match="outside the cache folder"):
            cache.path(bad)
