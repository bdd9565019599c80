"""`shardsmith report s3://...`: a dataset in object storage gets the same figures as its local
folder (its shards fetched into the node cache), and without -o the page lands in the current
folder, named after the URL's last part."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.cli import main

pytestmark = pytest.mark.s3


def test_a_url_reports_what_its_local_folder_reports(
    demo_builds: dict[str, Path],
    s3_bucket: str,
    upload: Callable[[Path, str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = demo_builds["demo_ct"]
    url = upload(local, f"{s3_bucket}/ct")
    monkeypatch.setenv("SHARDSMITH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["report", url]) == 0
    remote = json.loads((tmp_path / "ct.json").read_text())
    assert main(["report", str(local), "-o", str(tmp_path / "local.html")]) == 0
    here = json.loads((tmp_path / "local.json").read_text())
    assert remote["dataset"] == url and (tmp_path / "ct.html").is_file()
    assert remote["sections"]["CT"] == here["sections"]["CT"]  # HU values read from the shards
    assert remote["inspect"]["splits"] == here["inspect"]["splits"]
