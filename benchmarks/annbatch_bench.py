"""annbatch (scverse) as a loader baseline, in its own interpreter; optional, skipped with a
one-line reason.

Why a separate interpreter: annbatch >= 0.3 needs Python >= 3.12 (its sources use the ``type X =
...`` statement), the bench runs on whatever Python the project's venv has. So: find a Python >=
3.12 (``SHARDSMITH_ANNBATCH_PYTHON``, else ``python3.14``/``python3.13``/``python3.12`` on PATH,
else pyenv's versions), make a venv with ``annbatch[torch,zarrs]`` and the Makefile's torch pin
under the bench data folder (gitignored), convert the bench's .h5ad with annbatch's own writer,
then time annbatch's Loader there and our loader here with one timing loop
(``benchmarks/annbatch_worker.py``).

Two interpreters cannot share one process, so the pairing is at process level: a child of ours, a
child of annbatch, again, ``rounds`` times (ours, annbatch, ours, annbatch ...). A row's cells/s
is the median of its children's figures, its ratio the median over rounds of ours / annbatch in
the same round. Nothing here raises into the bench: every failure becomes a ``skipped`` or
``failed`` record whose reason BENCHMARKS.md prints.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.annbatch_worker import marker_of

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("annbatch_worker.py")
ENV_VAR = "SHARDSMITH_ANNBATCH_PYTHON"
MIN_PYTHON = (3, 12)
ON_PATH = ("python3.14", "python3.13", "python3.12")
# the release whose API the worker follows (annbatch_worker.py); minor releases may break it
ANNBATCH_SPEC = os.environ.get("SHARDSMITH_ANNBATCH_SPEC", "annbatch[torch,zarrs]==0.3.1")
NO_PYTHON = (
    f"needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}, none found; "
    f"set {ENV_VAR}=/path/to/python3.12"
)
STREAMS = {  # worker stream -> (annbatch row, our row it is paired with)
    "default": (
        "annbatch default, densified (torch.from_numpy(X.toarray()))",
        "shards cells dense (w=0)",
    ),
    "sparse": ('annbatch to="torch" (torch sparse CSR)', "shards cells torch_sparse (w=0)"),
}


class Unavailable(Exception):
    """annbatch cannot be measured here; the message is the reason BENCHMARKS.md prints."""


@dataclass(frozen=True)
class Interpreter:
    path: str
    version: tuple[int, int, int]

    @property
    def tag(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


def probe_version(exe: str, timeout: float = 20.0) -> tuple[int, int, int] | None:
    """The interpreter's ``sys.version_info[:3]``, or None when it does not run or answers nonsense."""
    try:
        out = subprocess.run(
            [exe, "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=timeout,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.fullmatch(r"\s*(\d+) (\d+) (\d+)\s*", out)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _pyenv_pythons(root: Path) -> list[str]:
    """pyenv's installed versions, newest first (plain ``X.Y.Z`` folders only)."""
    found = []
    for d in root.glob("versions/*"):
        if re.fullmatch(r"\d+\.\d+\.\d+", d.name) and (d / "bin" / "python").exists():
            found.append((tuple(int(p) for p in d.name.split(".")), str(d / "bin" / "python")))
    return [p for _, p in sorted(found, reverse=True)]


def find_python(
    env: Mapping[str, str] | None = None, which: Callable[[str], str | None] = shutil.which
) -> Interpreter | str:
    """An interpreter >= 3.12 or the reason there is none. The environment variable, when set, is
    the only candidate (a wrong one is reported, not silently replaced)."""
    env = os.environ if env is None else env
    want = f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}"
    chosen = env.get(ENV_VAR, "").strip()
    if chosen:
        v = probe_version(chosen)
        if v is None:
            return f"{ENV_VAR}={chosen} does not run as a Python interpreter"
        if v[:2] < MIN_PYTHON:
            return f"{ENV_VAR}={chosen} is Python {v[0]}.{v[1]}.{v[2]}; annbatch needs >= {want}"
        return Interpreter(chosen, v)
    candidates = [p for p in (which(n) for n in ON_PATH) if p]
    candidates += _pyenv_pythons(Path(env.get("PYENV_ROOT") or Path.home() / ".pyenv"))
    for exe in candidates:
        v = probe_version(exe)
        if v is not None and v[:2] >= MIN_PYTHON:
            return Interpreter(exe, v)
    return NO_PYTHON


def skip_record(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


def _run(cmd: list[str], log: Path, timeout: float, what: str, **kw: Any) -> None:
    with open(log, "a") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n")
        fh.flush()
        try:
            rc = subprocess.run(
                cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, **kw
            ).returncode
        except subprocess.TimeoutExpired:
            raise Unavailable(f"{what} took over {timeout:.0f}s (log: {log})") from None
        except OSError as e:
            raise Unavailable(f"{what}: {e}") from None
    if rc != 0:
        raise Unavailable(f"{what} failed (exit {rc}; log: {log})")


def ensure_venv(py: Interpreter, folder: Path, torch_spec: str, timeout: float = 3600.0) -> str:
    """A venv with annbatch under ``folder``; reinstalled when the requested packages change (a
    stamp file holds what was installed, written last)."""
    venv = folder / f"venv-py{py.tag}"
    vpy = venv / "bin" / "python"
    stamp, want = venv / ".shardsmith-installed", f"{ANNBATCH_SPEC} {torch_spec}"
    if vpy.exists() and stamp.exists() and stamp.read_text() == want:
        return str(vpy)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "install.log"
    log.write_text("")
    if not vpy.exists():
        _run([py.path, "-m", "venv", str(venv)], log, 300, f"python{py.tag} -m venv")
    pip = [str(vpy), "-m", "pip", "install", "-q"]
    try:  # an old pip may not resolve the pins; an upgrade that fails is not fatal
        _run([*pip, "--upgrade", "pip"], log, 600, "pip upgrade in the annbatch venv")
    except Unavailable:
        pass
    _run([*pip, *shlex.split(torch_spec)], log, timeout, f"pip install {torch_spec}")
    try:
        _run([*pip, ANNBATCH_SPEC], log, timeout, f"pip install {ANNBATCH_SPEC}")
    except (
        Unavailable
    ):  # zarrs (a compiled codec pipeline) may have no wheel here: annbatch runs without it
        _run(
            [*pip, re.sub(r"\[[^]]*\]", "[torch]", ANNBATCH_SPEC)],
            log,
            timeout,
            "pip install annbatch[torch]",
        )
    stamp.write_text(want)
    return str(vpy)


def run_worker(
    python: list[str],
    task: str,
    spec: dict[str, Any],
    work: Path,
    tag: str,
    timeout: float,
    **kw: Any,
) -> dict[str, Any]:
    """One worker task in a child interpreter; its OUT document (an ``error`` key when it failed)."""
    spec_path, out_path, log = (
        work / f"annbatch-{tag}.json",
        work / f"annbatch-{tag}.out.json",
        work / "annbatch.log",
    )
    spec_path.write_text(json.dumps(spec, indent=1))
    out_path.unlink(missing_ok=True)
    try:
        _run([*python, task, str(spec_path), str(out_path)], log, timeout, f"{task} task", **kw)
    except Unavailable as e:
        doc = json.loads(out_path.read_text()) if out_path.exists() else {}
        return {**doc, "error": doc.get("error") or str(e)}
    return json.loads(out_path.read_text())


def ensure_collection(
    vpy: str, h5ad: str, folder: Path, work: Path, timeout: float
) -> dict[str, Any]:
    """The bench's .h5ad as an annbatch collection, converted once per dataset (cached by the
    .h5ad's folder name, which names every generator parameter)."""
    dest = folder / "collections" / f"{Path(h5ad).parent.name}.zarr"
    marker = marker_of(dest)
    if marker.exists():
        return {**json.loads(marker.read_text()), "collection": str(dest), "cached": True}
    dest.parent.mkdir(parents=True, exist_ok=True)
    doc = run_worker(
        [vpy, "-I", str(WORKER)],
        "convert",
        {"h5ad": h5ad, "collection": str(dest)},
        work,
        "convert",
        timeout,
    )
    if doc.get("error"):
        raise Unavailable(f"conversion with annbatch failed: {doc['error']}")
    return {**doc, "collection": str(dest), "cached": False}


def pair_rows(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows from the rounds' worker documents (round i of ours paired with round i of annbatch)."""
    rows = []
    for key, (name, our_name) in STREAMS.items():
        a = [d["streams"][key] for d in theirs]
        o = [d["streams"][key] for d in ours]
        ratios = [x["cells_per_s"] / y["cells_per_s"] for x, y in zip(o, a, strict=True)]
        rows.append(
            {
                "method": name,
                "stream": key,
                "ours": our_name,
                "cells_per_s": statistics.median(y["cells_per_s"] for y in a),
                "ttfb_s": statistics.median(y["ttfb_s"] for y in a),
                "ours_cells_per_s": statistics.median(x["cells_per_s"] for x in o),
                "ours_ttfb_s": statistics.median(x["ttfb_s"] for x in o),
                "ratio": statistics.median(ratios),
                "ratios": ratios,
            }
        )
    return rows


def measure(
    py: Interpreter,
    h5ad: str,
    shards_root: str,
    data_dir: Path,
    work: Path,
    *,
    batch_size: int,
    warmup: int,
    seconds: float,
    rounds: int,
    windows: int = 2,
    torch_spec: str = "torch",
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Install, convert, then ``rounds`` pairs of children (ours, annbatch); raises
    :class:`Unavailable`."""
    folder = data_dir / "annbatch"
    vpy = ensure_venv(py, folder, torch_spec)
    ver = run_worker([vpy, "-I", str(WORKER)], "version", {}, work, "version", 120)
    if ver.get("error"):
        raise Unavailable(f"annbatch does not import in {vpy}: {ver['error']}")
    conv = ensure_collection(vpy, h5ad, folder, work, timeout * 2)
    common = {"batch_size": batch_size, "warmup": warmup, "seconds": seconds, "windows": windows}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ours_cmd = [sys.executable, "-m", "benchmarks.annbatch_worker"]
    ours, theirs = [], []
    for r in range(rounds):
        o = run_worker(
            ours_cmd,
            "ours",
            {**common, "shards_root": shards_root},
            work,
            f"ours-{r}",
            timeout,
            cwd=REPO,
            env=env,
        )
        a = run_worker(
            [vpy, "-I", str(WORKER)],
            "annbatch",
            {**common, "collection": conv["collection"]},
            work,
            f"annbatch-{r}",
            timeout,
            cwd=folder,
        )
        for who, doc in (("our loader", o), ("annbatch", a)):
            if doc.get("error"):
                return {
                    "status": "failed",
                    "reason": f"{who} failed in round {r + 1}: {doc['error']}",
                    "log": str(work / "annbatch.log"),
                }
        ours.append(o)
        theirs.append(a)
    last = theirs[-1]
    return {
        "status": "measured",
        "python": f"{py.path} ({last['python']})",
        "annbatch": last["annbatch"],
        "zarrs": last["zarrs"],
        "preload_to_gpu": last["preload_to_gpu"],
        "settings": last["settings"],
        "convert_s": conv["convert_s"],
        "convert_cached": conv["cached"],
        "rounds": rounds,
        "windows": windows,
        "seconds": seconds,
        "warmup": warmup,
        "batch_size": batch_size,
        "rows": pair_rows(ours, theirs),
    }


def run_annbatch(
    h5ad: str,
    shards_root: str | None,
    data_dir: Path,
    work: Path,
    *,
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    **kw: Any,
) -> dict[str, Any]:
    """The bench's entry: a measured, skipped or failed record; never raises."""
    py = find_python(env, which)
    if isinstance(py, str):
        return skip_record(py)
    if not shards_root:
        return skip_record("no lz4 shards to pair it with (the build did not run or failed)")
    t0 = time.perf_counter()
    try:
        rec = measure(py, h5ad, shards_root, data_dir, work, **kw)
    except Unavailable as e:
        rec = {"status": "failed", "reason": str(e)}
    except Exception as e:  # an optional baseline never fails the bench
        rec = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    rec["took_s"] = time.perf_counter() - t0
    return rec


def summary_line(rec: dict[str, Any]) -> str:
    """One line for the console and for BENCHMARKS.md when nothing was measured."""
    return (
        f"annbatch: {rec['status']} — {rec.get('reason', '')}"
        if rec.get("status") != "measured"
        else (
            f"annbatch {rec['annbatch']}: "
            + "; ".join(
                f"{r['stream']} {r['cells_per_s']:,.0f} cells/s, ours/annbatch {r['ratio']:.2f}x"
                for r in rec["rows"]
            )
        )
    )


def markdown(rec: dict[str, Any] | None) -> list[str]:
    """The annbatch subsection of BENCHMARKS.md's Loader section."""
    if not rec:
        return []
    lines = [
        "",
        "### annbatch (another interpreter; paired per process, not interleaved in one)",
        "",
    ]
    if rec.get("status") != "measured":
        return [*lines, summary_line(rec)]
    s = rec["settings"]
    lines += [
        f"annbatch {rec['annbatch']} in {rec['python']}, `Loader(batch_size={rec['batch_size']}, shuffle=True, rng=...)` "
        f"with every other setting at its default (chunk_size={s.get('chunk_size')}, preload_nchunks="
        f"{s.get('preload_nchunks')}, preload_to_gpu={rec['preload_to_gpu']}; zarrs codec pipeline "
        f"{'on' if rec['zarrs'] else 'off: not installed'}), reading a collection written by "
        f"`DatasetCollection.add_adatas` with its defaults (shuffled on write; converted in "
        f"{rec['convert_s']:.0f}s{', cached' if rec['convert_cached'] else ''}); `load_adata` keeps X only. Random "
        "batches: annbatch shuffles chunks of contiguous rows of its pre-shuffled store, ours cells within windows of "
        "shards; annbatch reads all cells, ours the train split. Protocol (both sides, `benchmarks/annbatch_worker.py`):"
        f" time to first batch, {rec['warmup']} warm-up batches, then {rec['windows']} windows of {rec['seconds']:g}s "
        "per stream, the two streams of a process taking turns; a process's figure is the median of its windows. "
        f"Processes alternate ours, annbatch, ours, annbatch ({rec['rounds']} pairs): two interpreters cannot share "
        "one process, so this pairing is at process level, weaker than the same-process ratios above. cells/s: "
        "median over processes; ratio: median over pairs of ours / annbatch.",
        "",
        "| method | cells/s | first batch (s) | ours | ours cells/s | ours / annbatch | per pair |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for r in rec["rows"]:
        lines.append(
            f"| {r['method']} | {r['cells_per_s']:,.0f} | {r['ttfb_s']:.2f} | {r['ours']} | "
            f"{r['ours_cells_per_s']:,.0f} | {r['ratio']:.2f}x | "
            f"{', '.join(f'{x:.2f}' for x in r['ratios'])} |"
        )
    return lines
