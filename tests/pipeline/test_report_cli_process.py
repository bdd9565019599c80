"""`shardsmith report` as its own process: listed in `--help`, writes DIR.html, DIR.json and
DIR_mqc.json beside the dataset by default, and exits 2 with one line naming a bad -o."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.process


def test_the_command_writes_beside_the_dataset_and_refuses_a_bad_out(
    demo_builds: dict[str, Path], checkout: Any, tmp_path: Path
) -> None:
    listed = checkout.cli("--help")
    assert "report" in listed.communicate(timeout=120)[0]
    ds = demo_builds["demo_ct"]
    p = checkout.cli("report", str(ds))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    for name in ("demo_ct.html", "demo_ct.json", "demo_ct_mqc.json"):
        assert (ds.parent / name).is_file() and str(ds.parent / name) in out
    assert not any(f.name.endswith(".html") for f in ds.iterdir())  # never inside the dataset
    (tmp_path / "f").write_text("")
    bad = checkout.cli("report", str(ds), "-o", str(tmp_path / "f" / "r.html"))
    out, err = bad.communicate(timeout=300)
    assert bad.returncode == 2 and f"{tmp_path / 'f' / 'r.html'}: cannot write" in err
    assert "Traceback" not in err
