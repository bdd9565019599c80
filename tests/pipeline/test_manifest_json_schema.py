"""`shardsmith schema` prints a JSON Schema an editor checks manifests with (Taplo, Even Better
TOML): every shipped manifest validates against it with a standard validator (``jsonschema``), a
typo'd key or a value of the wrong type is flagged before a build, a plug-in kind's sections are in
it, and it never flags a manifest the build accepts (no false underline).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomllib

from pipeline.cli import main
from pipeline.commands.schema import kind_schema, manifest_schema
from pipeline.errors import ManifestError
from pipeline.manifest import load_manifest

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((REPO / "data_manifests").rglob("*.toml"))


def _printed(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["schema", *args]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


def _problems(schema: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    return [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]


def test_every_shipped_manifest_validates_against_the_printed_schema(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert len(MANIFESTS) >= 10
    schema = _printed(capsys)
    for path in MANIFESTS:
        doc = tomllib.loads(path.read_text())
        assert _problems(schema, doc) == [], path
        kind = doc["dataset"].get("kind", "perturbation")
        assert _problems(_printed(capsys, kind), doc) == [], path


@pytest.mark.parametrize(
    ("edit", "flagged"),
    [
        (("ct", "windw", "lung"), "'windw' was unexpected"),  # a typo'd key
        (("ct", "min_points", "100"), "is not of type 'integer'"),  # a number in quotes
        (("ct", "window", "lnug"), "is not valid under any"),  # not a preset (nor a table)
        (("split", "group", "patient"), "is not one of"),
        (("dataset", "seed", -1), "less than the minimum"),
        (("dataset", "kind", "cts"), "is not one of"),
    ],
)
def test_a_typo_is_flagged_before_a_build(
    edit: tuple[str, str, Any], flagged: str, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tomllib.loads((REPO / "data_manifests" / "demo_ct.toml").read_text())
    section, key, value = edit
    doc[section][key] = value
    problems = _problems(_printed(capsys), doc)
    assert any(flagged in p for p in problems), problems


def test_a_plugin_kind_is_in_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    schema = _printed(capsys, "--plugin", "tests.plugin_toy", "toyvec")
    toy = schema["properties"]["toy"]
    assert set(toy["properties"]) == {"ragged", "val_fraction", "test_fraction"}
    assert schema["properties"]["sources"]["items"]["properties"]["type"]["enum"] == ["toy"]
    doc = {"dataset": {"name": "t", "kind": "toyvec"}, "sources": [{"path": "a.toy"}]}
    assert _problems(schema, doc | {"toy": {"ragged": False}}) == []
    assert _problems(schema, doc | {"toy": {"raggd": False}}) != []
    assert (
        "toyvec"
        in _printed(capsys, "--plugin", "tests.plugin_toy")["properties"]["dataset"]["properties"][
            "kind"
        ]["enum"]
    )


def test_an_unknown_kind_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "nope"]) == 2
    assert "'nope' is not one of" in capsys.readouterr().err


# values an operator might type, right or wrong, per key of the three built-in kinds
VALUES: list[Any] = [0, 1, 2, 40, -1, 0.5, 1.5, True, "", "x", "all", "RAS", "fewshot", [], ["a"]]
TYPED = ("expected a ", "expected an ", "expected true", "unknown key")
BASES: dict[str, dict[str, Any]] = {
    "perturbation": {"fields": {"cell_type": "ct"}, "pairing": {}, "split": {}},
    "ct": {"ct": {}, "split": {}},
    "spike": {"spike": {"height": 4, "width": 8}, "split": {}},
}


@pytest.mark.parametrize("kind", sorted(BASES))
def test_the_schema_never_flags_what_the_build_accepts(kind: str, tmp_path: Path) -> None:
    """One key at a time set to each of VALUES: whatever load_manifest accepts, the JSON Schema
    accepts too; a wrong type or an unknown key it refuses as the build does."""
    schema = manifest_schema()
    suffix = {"perturbation": "h5ad", "ct": "npy", "spike": "dat"}[kind]
    (tmp_path / f"a.{suffix}").write_bytes(b"")
    checked = 0
    for section in BASES[kind]:
        keys = list(kind_schema(kind)["properties"][section]["properties"])
        for key in [*keys, "typo"]:
            for value in VALUES:
                doc = {
                    "dataset": {"name": "d", "kind": kind},
                    "sources": [{"path": f"a.{suffix}"}],
                    **{s: dict(t) for s, t in BASES[kind].items()},
                }
                doc[section][key] = value
                path = tmp_path / "m.toml"
                path.write_text(_toml(doc))
                try:
                    load_manifest(path)
                    accepted = True
                except ManifestError as e:
                    accepted = False
                    typed = e.problem.startswith(TYPED)  # the one validator's type and key checks
                problems = _problems(schema, doc)
                if accepted:
                    assert problems == [], (section, key, value, problems)
                elif typed:
                    assert problems, (section, key, value, "refused by the build only")
                checked += 1
    assert checked > 100


def _toml(doc: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()

    out = []
    for section, table in doc.items():
        if section == "sources":
            for entry in table:
                out += ["[[sources]]", *(f"{k} = {value(v)}" for k, v in entry.items())]
        else:
            out += [f"[{section}]", *(f"{k} = {value(v)}" for k, v in table.items())]
    return "\n".join(out) + "\n"
