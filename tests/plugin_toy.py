"""A modality defined only in the tests: a source type, a dataset kind and a sample type, registered
through the public registries with no change to library code (docs/EXTENDING.md walks through the
same three pieces).

A ``.toy`` file is JSON: ``{"records": [{"group": str, "vec": [4 floats], "tokens": [ints < 50],
"skip": bool}]}``. Each record becomes a fixed-shape dense ``vec`` float32 [4] plus a ragged
``tokens`` int32 list (codes into a vocabulary of 50, declared as the field's ``bound``); no
pairs or other tables. ``[toy] ragged = false`` gives a dataset of dense fields only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loaders import format as fmt
from loaders.samples import SampleType, register_sample_type
from loaders.samples.gather import BatchRows
from loaders.samples.payload import Payload
from pipeline.errors import SourceError
from pipeline.manifest import Manifest, SourceSpec
from pipeline.model import ScannedSource, register_kind
from pipeline.records import Record, RecordKind, SkipRecord
from pipeline.schema import key
from pipeline.source import Source, register_source

VOCAB = 50


@register_source
class ToySource(Source):
    type = "toy"
    kinds = ("toyvec",)
    suffixes = (".toy",)
    produces = ("vec", "tokens")

    def records(self) -> list[dict[str, Any]]:
        try:
            return list(json.loads(self.path.read_text())["records"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SourceError(self.path, f"not a toy file ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class ToySettings:
    """[toy]: a plug-in kind's section, declared once (checked by the manifest, printed by
    `shardsmith schema`)."""

    ragged: bool = key("boolean", True, doc="store the ragged tokens field")
    val_fraction: float = key("number", 0.0, convert=float)
    test_fraction: float = key("number", 0.5, convert=float)


@register_kind
class ToyKind(RecordKind):
    name = "toyvec"
    section_types = {"toy": ToySettings}
    samples = ("toyvec",)

    def parse(self, path: Path, sections: Mapping[str, Any]) -> dict[str, Any]:
        t = sections["toy"]
        return {"ragged": t["ragged"], "val": t["val_fraction"], "test": t["test_fraction"]}

    def fractions(self, config: Any) -> tuple[float, float]:
        return config["val"], config["test"]

    def scan_source(self, manifest: Manifest, spec: SourceSpec) -> list[Record]:
        return [
            Record(i, str(r["group"]), (i,), nbytes=64, info={})
            for i, r in enumerate(ToySource(spec.path).records())
        ]

    def schema(
        self, manifest: Manifest, scanned: Sequence[ScannedSource]
    ) -> tuple[fmt.FieldSpec, ...]:
        fields = [
            fmt.FieldSpec(fmt.SAMPLE_ID, "dense", "int64"),
            fmt.FieldSpec("vec", "dense", "float32", (4,)),
        ]
        if manifest.config["ragged"]:
            fields.append(fmt.FieldSpec("tokens", "ragged", "int32", (), bound=VOCAB))
        return tuple(fields)

    def read_record(
        self, manifest: Manifest, spec: SourceSpec, record: Record
    ) -> tuple[dict[str, np.ndarray], Any]:
        r = ToySource(spec.path).records()[record.index]
        if r.get("skip"):
            raise SkipRecord("marked skip")
        return {
            "vec": np.asarray(r["vec"], np.float32),
            "tokens": np.asarray(r["tokens"], np.int32),
        }, {"n_tokens": len(r["tokens"])}

    def section(self, manifest: Manifest) -> dict[str, Any]:
        return {"ragged": manifest.config["ragged"]}


@register_sample_type
class ToySample(SampleType):
    """One record per unit: ``vec`` [B, 4], ``tokens`` padded with -1 to [B, longest], ``lengths``."""

    name = "toyvec"

    def fields(self, index: fmt.Index) -> list[str]:
        return [f.name for f in index.fields]

    def bind(self, index: fmt.Index) -> None:
        self.ragged = index.has_field("tokens")

    def units(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.arange(columns[fmt.SAMPLE_ID].shape[0], dtype=np.int64)[:, None]

    def assemble(self, batch: BatchRows) -> Payload:
        rows = batch.rows(0)
        p = Payload(arrays={"sample_id": rows.take(fmt.SAMPLE_ID), "vec": rows.take("vec")})
        if self.ragged:
            tokens = rows.ragged("tokens")
            lengths = np.diff(tokens.offsets)
            padded = np.full((batch.size, int(lengths.max(initial=0))), -1, np.int32)
            padded[np.arange(padded.shape[1]) < lengths[:, None]] = tokens.values
            p.arrays["tokens"], p.arrays["lengths"] = padded, lengths
        return p


def write_toy(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"records": records}))
    return path
