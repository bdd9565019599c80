"""Small datasets and real subprocesses for the tests of the output folder: lock, ownership, generations."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.modalities.perturbation.demo import write_perturb_h5ad
from tests.pipeline_helpers import write_manifest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def small_manifest(root: Path, seed: int = 0, name: str = "m.toml") -> Path:
    """Two 200-cell sources (written once per root) and a manifest over them; ``seed`` changes every shard."""
    src = root / "src"
    if not src.exists():
        src.mkdir(parents=True)
        for i in range(2):
            write_perturb_h5ad(src / f"s{i}.h5ad", n_cells=200, n_genes=50, n_perts=4, seed=i)
    return write_manifest(root / name, seed=seed)


def listing(out: Path) -> set[str]:
    """Every path under ``out`` (folders inside zarr shards left out), relative."""
    names = set()
    for p in out.rglob("*"):
        rel = p.relative_to(out).as_posix()
        if rel.count("/") <= 1:
            names.add(rel)
    return names


def python(code: str, *args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter importing this checkout."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV,
                          cwd=ROOT, check=check, timeout=timeout)


def popen(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV, cwd=ROOT)


def cli(*args: str) -> subprocess.Popen[str]:
    """`shardsmith ARGS` as its own process."""
    return subprocess.Popen([sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)


# A build that kills itself (SIGKILL: no cleanup runs) at the N-th call of a function: argv = manifest, out,
# "module:function", N. Sources go through spill files, as big ones do.
KILLED_BUILD = """
import importlib, os, signal, sys
import pipeline.modalities.perturbation.pack
pipeline.modalities.perturbation.pack.FUSE_BYTES, pipeline.modalities.perturbation.pack.SCATTER_BYTES = 0, 1
manifest, out, target, after = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
module, name = target.split(":")
mod = importlib.import_module(module)
original, calls = getattr(mod, name), [0]
def dying(*a, **k):
    calls[0] += 1
    if calls[0] > after:
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*a, **k)
setattr(mod, name, dying)
from pipeline.build import build
build(manifest, out, jobs=1, progress=False)
"""


def killed_build(manifest: Path, out: Path, target: str, after: int) -> None:
    res = python(KILLED_BUILD, str(manifest), str(out), target, str(after))
    assert res.returncode == -9, res.stderr
