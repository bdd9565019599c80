"""Every demo manifest built as zarr and tar into a folder, one line per shard: its content sha256.

Why: a refactor that must not change a byte a build writes is checked by running this on the old and the
new checkout and diffing the sorted outputs (shard file names carry a code digest, so names differ; the
sha256 of each shard's content must not).

    python -m benchmarks.experiments.build.demo_digests OUT > digests.txt
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from loaders.format.files import content_hash

REPO = Path(__file__).resolve().parents[3]
DEMOS = ("demo", "demo_spike", "demo_ct")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "out", type=Path, help="a new folder: demo sources, manifests and builds go here"
    )
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "data_manifests", a.out / "data_manifests", dirs_exist_ok=True)
    cli = [sys.executable, "-m", "pipeline"]
    subprocess.run([*cli, "demo", str(a.out / "data" / "demo")], check=True, capture_output=True)
    for demo in DEMOS:
        for encoding in ("zarr", "tar"):
            out = a.out / f"{demo}-{encoding}"
            manifest = a.out / "data_manifests" / f"{demo}.toml"
            subprocess.run(
                [
                    *cli,
                    "build",
                    str(manifest),
                    "--out",
                    str(out),
                    "--format",
                    encoding,
                    "--no-progress",
                ],
                check=True,
                capture_output=True,
            )
            for shard in json.loads((out / "index.json").read_text())["shards"]:
                # sha256 of the content, computed here: index digests changed algorithm (index
                # version 4, xxh3-128), so the index's own would not compare across that change
                sha = content_hash(out / "shards" / shard["file"], "sha256").split(":")[1]
                print(f"{demo}-{encoding} {shard['split']} {sha} {shard['records']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
