"""`shardsmith push` and `build --out s3://...` against a real S3 server (SeaweedFS; moto too for the store, tests/remote/conftest.py):
what is uploaded (everything once, index.json last; then only what changed), what is kept (the
previous generation, objects no push wrote) and deleted, the lock, and bad input."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import format as fmt
from loaders.remote import ObjectStore, open_store
from pipeline.cli import main
from pipeline.errors import LockHeldError
from pipeline.push import LOCK_KEY, RECORD_KEY, push
from tests import hostile

pytestmark = pytest.mark.s3  # an S3 server (SeaweedFS) (tests/remote/conftest.py)


class Recording(ObjectStore):
    """The store, remembering the order of its writes."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.writes: list[str] = []

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        self.writes.append(key)

    def put_file(self, key: str, path: Any) -> int:
        n = super().put_file(key, path)
        self.writes.append(key)
        return n


def _objects(out: Path) -> dict[str, int]:
    """Every object a push of ``out`` holds: the committed generation's files, as keys."""
    keys = {}
    for rel in fmt.read_index(out).files():
        p = out / rel
        for f in [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()):
            keys[f.relative_to(out).as_posix()] = f.stat().st_size
    return keys


def test_push_uploads_every_object_index_last(rebuildable: Any, s3_bucket: str) -> None:
    out, _ = rebuildable
    store = Recording(f"{s3_bucket}/team/ds")
    res = push(out, store.url, progress=False, store=store)
    local = _objects(out)
    remote = {o.key: o.size for o in store.list()}
    assert remote == {
        **local,
        "index.json": (out / "index.json").stat().st_size,
        RECORD_KEY: remote[RECORD_KEY],
    }
    assert store.get("index.json") == (out / "index.json").read_bytes()
    shard_writes = [k for k in store.writes if k != RECORD_KEY]
    assert shard_writes[-1] == "index.json" and sorted(shard_writes[:-1]) == sorted(local)
    assert res.unchanged == 0 and LOCK_KEY not in remote


def test_repush_uploads_only_what_changed(rebuildable: Any, s3_bucket: str) -> None:
    out, change_source_1 = rebuildable
    url = f"{s3_bucket}/ds"
    push(out, url, progress=False)
    again = push(out, url, progress=False)
    assert again.uploaded == [] and again.unchanged == len(_objects(out))  # nothing changed
    written = change_source_1()
    assert written and all("-001-" in f for f in written)
    store = open_store(url)
    res = push(out, url, progress=False, store=store)
    changed = {k for k in _objects(out) if any(k.startswith(f"shards/{f}") for f in written)}
    assert set(res.uploaded) == changed | {"index.json"}
    assert res.unchanged == len(_objects(out)) - len(changed) > 0
    uploaded_bytes = sum(s for k, s in _objects(out).items() if k in changed)
    assert res.bytes_uploaded == uploaded_bytes
    assert store.stats["get_requests"] <= 4  # index, record, lock read-backs: never a shard


@hostile.parametrize
def test_replaced_remote_object_is_uploaded_again(
    case: hostile.Case, rebuildable: Any, s3_bucket: str, s3_client: Any
) -> None:
    out, _ = rebuildable
    push(out, f"{s3_bucket}/ds", progress=False)
    key = sorted(k for k in _objects(out) if k.startswith("shards/"))[0]
    s3_client.put_object(Bucket=s3_bucket[5:], Key=f"ds/{key}", Body=b"tampered")
    res = push(out, f"{s3_bucket}/ds", progress=False)
    assert res.uploaded == [key, "index.json"]
    assert open_store(f"{s3_bucket}/ds").get(key) == (out / key).read_bytes()


@hostile.parametrize
def test_previous_generation_kept_one_push_foreign_objects_never_deleted(
    case: hostile.Case, rebuildable: Any, s3_bucket: str
) -> None:
    out, change_source_1 = rebuildable
    url = f"{s3_bucket}/ds"
    store = open_store(url)
    store.put("shards/README.txt", b"not ours")
    store.put("notes/keep.txt", b"not ours")
    push(out, url, progress=False)
    gen1 = set(_objects(out))
    change_source_1()
    push(out, url, progress=False)
    gen2 = set(_objects(out))
    keys = {o.key for o in store.list()}
    assert gen1 | gen2 <= keys, "the previous generation stays for readers that opened it"
    change_source_1()
    res = push(out, url, progress=False)
    gen3 = set(_objects(out))
    keys = {o.key for o in store.list()}
    assert gen2 | gen3 <= keys
    assert not (gen1 - gen2 - gen3) & keys and set(res.deleted) == gen1 - gen2 - gen3
    assert {"shards/README.txt", "notes/keep.txt"} <= keys
    assert json.loads(store.get(RECORD_KEY))["retired"] == []


@hostile.parametrize
def test_second_push_waits_then_exits_3(
    case: hostile.Case, rebuildable: Any, s3_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = rebuildable
    url = f"{s3_bucket}/ds"
    holder = {"token": "x", "pid": 1, "host": "node7", "since": time.time(), "url": url}
    if case.data == "stale":  # left by a push killed 7 h ago
        holder["since"] = time.time() - 7 * 3600
        open_store(url).put(LOCK_KEY, json.dumps(holder).encode())
        with pytest.raises(LockHeldError, match=r"7\.0 h old.*aws s3 rm"):
            push(out, url, progress=False)
        return
    assert open_store(url).put_if_absent(LOCK_KEY, json.dumps(holder).encode())
    start = time.monotonic()
    assert main(["-q", "push", str(out), url, "--wait", "1"]) == 3
    assert 1 <= time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert f"{url}/{LOCK_KEY}" in err and "pid 1 on node7" in err and "waited 1 s" in err
    assert open_store(url).head("index.json") is None, "nothing was pushed"


@hostile.parametrize
def test_bad_input_exits_2_naming_the_url(
    case: hostile.Case,
    rebuildable: Any,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    out, _ = rebuildable
    url = f"{s3_bucket}/ds"
    monkeypatch.setenv("SHARDSMITH_REMOTE_RETRY", "attempts=2,base_s=0.05,total_s=3")
    if case.data == "no bucket":
        url = "s3://no-such-bucket-here/ds"
    elif case.data == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    elif case.data == "unreachable":
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    else:
        out = tmp_path / "empty"
        out.mkdir()
    start = time.monotonic()
    assert main(["-q", "push", str(out), url]) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    fix = {
        "no bucket": "the bucket does not exist",
        "no credentials": "AWS_ACCESS_KEY_ID",
        "unreachable": "AWS_ENDPOINT_URL",
        "no index": "no index.json",
    }[case.data]
    assert (str(out) if case.data == "no index" else url) in err and fix in err


def test_build_out_url_stages_then_pushes(
    tmp_path: Path,
    build_dataset: Callable[..., Any],
    s3_bucket: str,
    s3_proxy: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    manifest = build_dataset(tmp_path, "manifest", sources=2, cells=200, genes=40).manifests["zarr"]
    url = f"{s3_bucket}/nightly/ds"
    stage = tmp_path / "stage"
    argv = ["-q", "build", str(manifest), "--out", url, "--stage", str(stage), "--jobs", "1", "--json"]
    assert main(argv) == 0
    store = open_store(url)
    assert {o.key for o in store.list()} >= set(_objects(stage)) | {"index.json"}
    assert store.get("index.json") == (stage / "index.json").read_bytes()
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1, lines  # --json: stdout is the summary line alone
    summary = json.loads(lines[0])
    assert summary["out"] == url and summary["staged"] == str(stage)
    s3_proxy.requests.clear()
    assert main(argv) == 0  # nothing changed: the staged shards are reused, nothing uploaded
    puts = [p for m, p in s3_proxy.requests if m == "PUT" and not p.endswith(LOCK_KEY)]
    assert puts == [], puts


class Held(ObjectStore):
    """A store whose first upload waits for ``go``: its push holds the lock until the test says."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.go = threading.Event()

    def put_file(self, key: str, path: Any) -> int:
        self.go.wait(30)
        return super().put_file(key, path)


class IgnoresIfNoneMatch(ObjectStore):
    """A server that ignores the conditional put's header: the put always overwrites."""

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.put(key, data)
        return True


@hostile.parametrize
def test_two_pushes_at_once_one_exits_locked(
    case: hostile.Case, rebuildable: Any, s3_bucket: str
) -> None:
    out, _ = rebuildable
    url = f"{s3_bucket}/ds"
    held = Held(url)
    kwargs = {"progress": False, "jobs": 1, "store": held}
    first = threading.Thread(target=push, args=(out, url), kwargs=kwargs)
    first.start()
    deadline = time.monotonic() + 30
    while open_store(url).head(LOCK_KEY) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    second = ObjectStore(url) if case.data == "conditional put" else IgnoresIfNoneMatch(url)
    try:
        with pytest.raises(LockHeldError, match="another push holds"):
            push(out, url, progress=False, store=second)
    finally:
        held.go.set()
    first.join()
    assert open_store(url).get("index.json") == (out / "index.json").read_bytes()
    assert open_store(url).head(LOCK_KEY) is None, "the first push released its lock"


@hostile.parametrize
def test_another_dataset_at_the_url_is_refused(
    case: hostile.Case, rebuildable: Any, s3_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = rebuildable
    url = f"{s3_bucket}/ds"
    other = json.loads((out / "index.json").read_bytes())
    other["name"] = "someone-elses"
    open_store(url).put("index.json", json.dumps(other).encode())
    assert main(["-q", "push", str(out), url]) == 2
    assert "holds dataset 'someone-elses'" in capsys.readouterr().err
    assert json.loads(open_store(url).get("index.json"))["name"] == "someone-elses"
    assert main(["-q", "push", str(out), url, "--replace"]) == 0


@hostile.parametrize
def test_a_tampered_record_deletes_nothing_foreign(
    case: hostile.Case, rebuildable: Any, s3_bucket: str
) -> None:
    """The record is the remote's word: it may claim any name. ``case.data``: (objects a user
    keeps under the prefix, the names the record is edited to claim)."""
    out, change_source_1 = rebuildable
    foreign, claimed = case.data
    url = f"{s3_bucket}/ds"
    store = open_store(url)
    for key in foreign:
        store.put(key, b"not ours")
    push(out, url, progress=False)
    record = json.loads(store.get(RECORD_KEY))
    record["owned"] += claimed
    store.put(RECORD_KEY, json.dumps(record).encode())
    for _ in range(2):
        change_source_1()
        push(out, url, progress=False)
    keys = {o.key for o in store.list()}
    assert {*foreign, "index.json"} <= keys, sorted(set(foreign) - keys)
