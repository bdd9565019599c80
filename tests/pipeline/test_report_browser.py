"""The report page in a real browser: Debian's headless Chromium loads each demo's page from disk
(no network), its one script runs to the end without an error in the console, and the screenshot
shows a page (many colours, not a blank or one-colour canvas). `make test` installs chromium where
the machine allows (root and apt-get); elsewhere this test skips and says why."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.cli import main

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One headless run over ``page`` with a fresh profile, its console logged to stderr."""
    cmd = [
        CHROMIUM or "chromium",
        *FLAGS,
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
        page.as_uri(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def script_errors(stderr: str) -> list[str]:
    """Console lines that report a script error (an uncaught exception, console.error)."""
    console = [ln for ln in stderr.splitlines() if ":CONSOLE" in ln]
    return [ln for ln in console if "Uncaught" in ln or "Error" in ln or ":ERROR:CONSOLE" in ln]


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (make test installs it "
    "with apt-get where it runs as root; elsewhere: apt-get install chromium)",
)
@pytest.mark.parametrize("stem", ["demo", "demo_spike", "demo_ct"])
def test_the_page_renders_in_chromium_without_a_script_error(
    demo_builds: dict[str, Path], tmp_path: Path, stem: str
) -> None:
    image = pytest.importorskip(
        "PIL.Image", reason="Pillow reads the screenshot (the images extra)"
    )
    page = tmp_path / f"{stem}.html"
    assert main(["report", str(demo_builds[stem]), "-o", str(page)]) == 0
    dom = chromium(page, tmp_path / "profile-dom", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert script_errors(dom.stderr) == []
    # the script's last statement marks the body: it ran to the end, over every plot
    marker = re.search(r'data-rendered="(\d+) plots"', dom.stdout)
    assert marker is not None and int(marker.group(1)) == page.read_text().count("<svg")
    shot = tmp_path / f"{stem}.png"
    run = chromium(
        page, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1000,1800"
    )
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    assert script_errors(run.stderr) == []
    with image.open(shot) as img:
        grey = img.convert("L")
        colours = img.convert("RGB").getcolors(maxcolors=1 << 20) or []
        hist = grey.histogram()
    assert len(colours) > 50  # text, tables and plots; a blank page has one colour
    white = hist[255] / sum(hist)
    assert 0.2 < white < 0.995  # mostly page background, but something is drawn on it
