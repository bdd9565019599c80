"""Every modality's demo (perturbation, spike, CT), built as zarr and as tar, uploaded to S3 and
read back through the node cache: batch for batch what the local folder serves."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loaders import ShardDataset

pytestmark = [
    pytest.mark.process,
    pytest.mark.s3,
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]  # an S3 server (SeaweedFS); the decoder process
REPO = Path(__file__).resolve().parents[2]
DEMOS = ["demo.toml", "demo_spike.toml", "demo_ct.toml"]


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipeline.commands.demo import write_demo

    root = tmp_path_factory.mktemp("demos")
    (root / "data_manifests").mkdir()
    for m in DEMOS:
        shutil.copy(REPO / "data_manifests" / m, root / "data_manifests" / m)
    write_demo(root / "data" / "demo")
    return root


@pytest.mark.parametrize("enc", ["zarr", "tar"])
@pytest.mark.parametrize("manifest", DEMOS)
def test_demo_read_from_s3_equals_local(
    manifest: str,
    enc: str,
    demo_root: Path,
    s3_proxy: Any,
    s3_bucket: str,
    upload: Callable[..., str],
    tmp_path: Path,
    batches: Callable[..., Any],
    assert_same: Callable[..., None],
) -> None:
    from pipeline.build import build

    out = tmp_path / "out"
    build(demo_root / "data_manifests" / manifest, out, jobs=1, progress=False, encoding=enc)
    url = upload(out, f"{s3_bucket}/{manifest}-{enc}")
    kw: dict[str, Any] = {"split": "train", "batch_size": 4, "window": 2, "seed": 1}
    local = batches(ShardDataset(out, **kw), epochs=(0,))
    remote = ShardDataset(url, cache_dir=tmp_path / "cache", **kw)
    assert_same(batches(remote, epochs=(0,)), local)
    gets = s3_proxy.gets()
    assert gets and max(gets.values()) == 1
