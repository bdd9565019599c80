"""`shardsmith report` as a person reads it: the page and FILE.json of each demo `make shards`
builds hold the numbers `inspect --json` prints, name every perturbation of the screen, load
nothing from elsewhere; bad input gets exit 2 naming the path; an index written by an older
shardsmith gets a page that says which figures it cannot show."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main
from tests import hostile

OLD = Path(__file__).resolve().parents[1] / "data" / "sha256-index" / "zarr"


def report(capsys: pytest.CaptureFixture[str], dataset: Path, out: Path, *flags: str) -> dict:
    """Run the command in this process: its exit code, output, page and JSON."""
    capsys.readouterr()
    code = main(["report", str(dataset), "-o", str(out), *flags])
    text = capsys.readouterr()
    page = out.read_text() if out.is_file() else ""
    data = json.loads(out.with_suffix(".json").read_text()) if out.is_file() else {}
    return {"code": code, "out": text.out, "err": text.err, "page": page, "json": data}


def inspect_json(capsys: pytest.CaptureFixture[str], dataset: Path) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["inspect", str(dataset), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def pages(demo_builds: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("reports")
    done = {}
    for stem, ds in demo_builds.items():
        code = main(["report", str(ds), "-o", str(out / f"{stem}.html")])
        page = out / f"{stem}.html"
        done[stem] = {
            "code": code,
            "page": page.read_text(),
            "json": json.loads(page.with_suffix(".json").read_text()),
            "mqc": json.loads((out / f"{stem}_mqc.json").read_text()),
            "dataset": ds,
        }
    return done


def figures(doc: dict, section: str) -> dict[str, Any]:
    return {k: v["data"] for k, v in doc["sections"][section].items() if "data" in v}


@pytest.mark.parametrize("stem", ["demo", "demo_spike", "demo_ct"])
def test_the_json_holds_what_inspect_json_prints(
    pages: dict, stem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    got = pages[stem]
    assert got["code"] in (0,)  # warnings alone do not fail without --strict
    assert got["json"]["inspect"] == inspect_json(capsys, got["dataset"])
    assert got["json"]["not_shown"] == [] and "Not shown" not in got["page"]
    summary = got["json"]["inspect"]
    table = dict(figures(got["json"], "Dataset")["summary"])
    assert table["bytes stored"] == summary["bytes"] and table["sources"] == summary["sources"]
    assert table["shards"] == sum(v["shards"] for v in summary["splits"].values())
    assert table["digest algorithm"] == "xxh3_128"


def test_perturbation_figures_count_the_cells_inspect_counts(pages: dict) -> None:
    doc = pages["demo"]["json"]
    summary, fig = doc["inspect"], figures(doc, "Perturbation")
    cells = {s: v["units"]["cells"] for s, v in summary["splits"].items()}
    assert sum(fig["cells_per_perturbation"]["cells"].values()) == sum(cells.values())
    grid = fig["split_by_cell_type"]
    per_split = [sum(row[j] for row in grid["cells"]) for j in range(len(grid["splits"]))]
    assert dict(zip(grid["splits"], per_split, strict=True)) == cells
    # the flagged groups are the ones the build counted behind its warning
    assert "128 of 192 perturbations" in summary["warnings"][0]
    assert (
        fig["cells_per_perturbation"]["short_groups"],
        fig["cells_per_perturbation"]["groups"],
    ) == (128, 192)
    pairing = summary["details"]["pairing"]
    assert fig["pairing"]["pairs"] == {
        lv: pairing[f"pairs_{lv}"] for lv in ("exact", "cell_type", "source", "split")
    }
    assert fig["conditions"]["rows"] == summary["details"]["conditions"]


def test_the_page_names_every_perturbation_in_its_chart(pages: dict) -> None:
    page, doc = pages["demo"]["page"], pages["demo"]["json"]
    names = doc["inspect"]["vocabularies"]["perturbation"]
    assert len(names) == 36
    chart = re.search(r'<h3 id="cells-per-perturbation">.*?</svg>', page, re.S)
    assert chart is not None
    texts = set(re.findall(r"<text[^>]*>([^<]+)</text>", chart.group(0)))
    controls = {"control"}
    assert {n for n in names if n not in controls} <= {t.strip() for t in texts}
    for name in names:  # the table names each with its count
        count = doc["sections"]["Perturbation"]["cells_per_perturbation"]["data"]["cells"][name]
        assert re.search(rf"<td>{name}</td><td class=\"n\">{count:,}</td>", page)


def test_ct_and_spike_figures_hold_the_index_numbers(pages: dict) -> None:
    ct = pages["demo_ct"]["json"]
    d = ct["inspect"]["details"]
    fig = figures(ct, "CT")
    assert sum(v["points"] for v in fig["volumes"]) == d["points"]
    assert sum(fig["hu_histogram"]["voxels"]) == fig["hu_histogram"]["points"] == d["points"]
    lo, hi = d["settings"]["band"]
    assert lo <= fig["hu_histogram"]["min"] <= fig["hu_histogram"]["max"] <= hi
    spike = pages["demo_spike"]["json"]
    sf = figures(spike, "Spike")
    assert len(sf["files"]["files"]) == sum(
        v["records"] for v in spike["inspect"]["splits"].values()
    )
    assert sf["files"]["resolution"] == [64, 96]
    assert all(0 < f["rate"] < 1 and f["frames"] == 40 for f in sf["files"]["files"])
    check = sf["resolution_check"]["row_correlation"]
    assert check["96"] > 0.5  # the declared width is the true one: its rows correlate


def test_the_page_loads_nothing_from_elsewhere(pages: dict) -> None:
    for got in pages.values():
        page = got["page"]
        assert "<link" not in page and "@import" not in page
        assert not re.search(r"<script[^>]*\bsrc=", page)
        assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)
        assert not re.search(r"url\(\s*['\"]?(https?:|//)", page)
        assert len(page) < 3_000_000


def test_the_multiqc_file_is_custom_content_with_a_row_per_split(pages: dict) -> None:
    mqc, summary = pages["demo"]["mqc"], pages["demo"]["json"]["inspect"]
    assert mqc["plot_type"] == "table" and mqc["id"].startswith("shardsmith_")
    assert {k.split()[-1]: v["records"] for k, v in mqc["data"].items()} == {
        s: v["records"] for s, v in summary["splits"].items()
    }


def test_the_same_dataset_gives_the_same_page(
    demo_builds: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = report(capsys, demo_builds["demo_ct"], tmp_path / "a.html")
    b = report(capsys, demo_builds["demo_ct"], tmp_path / "b.html")
    assert a["page"] == b["page"]


def test_strict_exits_1_on_warnings_only(
    demo_builds: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    warned = report(capsys, demo_builds["demo"], tmp_path / "p.html", "--strict")
    assert warned["code"] == 1 and "warning" in warned["out"] and warned["page"]
    clean = report(capsys, demo_builds["demo_ct"], tmp_path / "c.html", "--strict")
    assert clean["code"] == 0


@hostile.parametrize
def test_a_folder_without_a_dataset_exits_2_as_verify(
    case: hostile.Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "empty", tmp_path / "absent"):
        got = report(capsys, folder, tmp_path / "r.html")
        assert (
            got["code"] == 2 and str(folder) in got["err"] and "pass a dataset folder" in got["err"]
        )
        assert main(["verify", str(folder)]) == 2
    assert not (tmp_path / "r.html").exists()


@hostile.parametrize
def test_an_unwritable_out_exits_2_naming_the_path(
    case: hostile.Case,
    demo_builds: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "a_file").write_text("x")
    for out in (tmp_path / "a_file" / "r.html", tmp_path / "folder.html"):
        if out.name == "folder.html":
            out.mkdir()
        got = report(capsys, demo_builds["demo_ct"], out)
        assert got["code"] == 2 and str(out) in got["err"] and "cannot write" in got["err"]
        assert "Traceback" not in got["err"]


@hostile.parametrize
def test_an_older_index_gets_a_page_saying_what_it_cannot_show(
    case: hostile.Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = report(capsys, OLD, tmp_path / "v2.html")  # committed as index version 2 wrote it
    assert (
        kept["code"] == 0 and "index version 2" in kept["page"] and kept["json"]["not_shown"] == []
    )
    assert kept["json"]["sections"]["Dataset"]["summary"]["data"]["digest algorithm"] == "sha256"
    old = Path(shutil.copytree(OLD, tmp_path / "old"))
    raw = json.loads((old / "index.json").read_text())
    del raw["stats"]["pairing"], raw["conditions"]  # as a build that recorded neither
    (old / "index.json").write_text(json.dumps(raw))
    got = report(capsys, old, tmp_path / "old.html")
    assert got["code"] == 0 and "Traceback" not in got["err"]
    missing = got["json"]["not_shown"]
    assert [m.split(":")[0] for m in missing] == [
        "Perturbation, Pairing provenance",
        "Perturbation, Condition vector",
    ]
    assert all("index (version 2) does not record" in m for m in missing)
    assert "cannot be shown" in got["page"] and "Pairing provenance" in got["page"]


@hostile.parametrize
def test_an_older_spike_index_names_the_counts_it_lacks(
    case: hostile.Case,
    demo_builds: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = Path(shutil.copytree(demo_builds["demo_spike"], tmp_path / "spike"))
    raw = json.loads((old / "index.json").read_text())
    raw["version"] = 3
    for key in ("frames_per_file", "resolution_hints", "sequences_with_unequal_frames"):
        del raw["stats"][key]  # counted only since index version 4
    (old / "index.json").write_text(json.dumps(raw))
    got = report(capsys, old, tmp_path / "s.html")
    assert got["code"] == 0
    assert [m.split(":")[0] for m in got["json"]["not_shown"]] == ["Spike, Frames per source file"]
    assert "index version 3" in got["page"]


def test_a_zero_shot_split_names_its_held_out_cell_types(
    build_dataset: Callable[..., Any],
    write_manifest: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pipeline.build import build

    build_dataset(tmp_path, "sources", sources=2, cells=300, genes=30)
    manifest = write_manifest(tmp_path / "m.toml", split="zeroshot")
    text = manifest.read_text().replace("val_fraction = 0.1", "val_fraction = 0.0")
    manifest.write_text(text)  # two cell types: one held out for test, one kept for train
    build(manifest, tmp_path / "out", jobs=1, progress=False)
    got = report(capsys, tmp_path / "out", tmp_path / "z.html")
    grid = got["json"]["sections"]["Perturbation"]["split_by_cell_type"]["data"]
    held = grid["held_out_cell_types"]
    assert held and set(held) < set(grid["cell_types"])
    train = grid["splits"].index("train")
    kept = [t for t, row in zip(grid["cell_types"], grid["cells"], strict=True) if row[train]]
    assert set(held).isdisjoint(set(kept) - set(held)) and all(t in got["page"] for t in held)
    assert f"held out of train: cell types {', '.join(held)}" in got["page"]


def test_the_mean_frame_image_is_a_png_of_the_declared_resolution(pages: dict) -> None:
    image = pytest.importorskip("PIL.Image", reason="Pillow decodes the PNG (the images extra)")
    import base64
    import io

    page = pages["demo_spike"]["page"]
    first = re.search(r'href="data:image/png;base64,([^"]+)"', page)
    assert first is not None
    with image.open(io.BytesIO(base64.b64decode(first.group(1)))) as img:
        assert img.size == (96, 64) and img.mode == "L"  # width x height as declared
        assert len(img.getcolors(256) or []) > 32  # a scene, not a flat frame
