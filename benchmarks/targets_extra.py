"""The targets added after the benchmark issue's five, from one results document: remote reads
(issue 23), the CT crop (issue 26.4), persistent workers by default (issue 26.5), and figures
reported without a goal (remote first batch, cache and network bytes; the digest check's cost on
read, issue 26.1)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.locations import RESULTS
from benchmarks.remote_link_bench import link_targets
from benchmarks.report_bench import report_targets
from benchmarks.verdicts import target

MB = 1e6
SCALE_JSON = RESULTS / "scale.json"


def reported(
    name: str, what: str, value: float | None, unit: str, detail: str = ""
) -> dict[str, Any]:
    """A figure shown in the targets table with no goal (so no verdict)."""
    return {
        "name": name,
        "what": what,
        "status": "reported" if value is not None else "not measured",
        "value": value,
        "goal": None,
        "unit": unit,
        "by": "reported (no goal)" if value is not None else "",
        "detail": detail,
    }


def cpu_bound(rm: dict[str, Any]) -> str:
    """23b's CPU accounting (benchmarks/remote_limits.py, `cpu_figures`), where it was measured:
    what a cold epoch may reach while the server shares the loader's cores."""
    per_m = rm.get("cpu_s_per_million_cells")
    if not per_m or rm.get("cpu_ceiling_over_bound") is None:
        return ""
    return (
        f"; CPU-s per million cells: local epoch {per_m['local']:.2f}, raw GETs "
        f"{per_m['raw_get']:.2f} (server + client), cold epoch {per_m['cold']:.2f} (with the "
        f"server's); {rm['cores']} cores allow a cold epoch at most "
        f"{rm['cpu_ceiling_cells_s']:,} cells/s = {rm['cpu_ceiling_over_bound']:.2f}x the bound "
        f"(local + GET CPU per cell); the cold epochs kept {rm['cold_cores_busy']:.2f} cores busy"
    )


def order_bound(rm: dict[str, Any]) -> str:
    """23b's ordering ceiling (`benchmarks.remote_limits.order_figures`), where it was measured:
    over all rounds, and over the rounds whose bound was the GET limit."""
    if rm.get("order_ceiling_over_bound") is None:
        return ""
    n, got = rm["windows"], rm.get("order_ceiling_get_bound")
    by_get = (
        f", {got:.2f}x in the {rm['rounds_get_bound']} rounds bound by the GET limit"
        if got is not None
        else ""
    )
    return (
        f"; the order of the work allows at most {rm['order_ceiling_over_bound']:.2f}x{by_get} "
        f"({n} window{'s' if n != 1 else ''}: a window serves no batch before all its shards are "
        "in the cache, so at least its serving follows the last download)"
    )


def remote_targets(rm: dict[str, Any]) -> list[dict[str, Any]]:
    ok = "cells_per_s" in rm
    rate = rm.get("cells_per_s", {})
    why = "" if ok else f"remote: {rm.get('skipped') or rm.get('error') or 'not run'}"
    setup = f"{rm.get('setup', '')}; " if ok else why
    local, limit = rate.get("local", 0), rm.get("raw_get_limit_cells_s", 0)
    return [
        target(
            "23a",
            "remote (moto S3 + node cache): warm-cache epoch / local-disk epoch (>= 0.95x)",
            rm.get("warm_over_local") if ok else None,
            0.95,
            True,
            detail=f"{setup}warm {rate.get('warm', 0):,} vs local {local:,} cells/s" if ok else why,
        ),
        target(
            "23b",
            "remote: cold epoch / min(local rate, raw GET limit in cells/s) (>= 0.8x)",
            rm.get("cold_over_bound") if ok else None,
            0.8,
            True,
            detail=f"cold {rate.get('cold', 0):,} cells/s; local {local:,}; raw GET "
            f"{rm.get('raw_get_MB_s', 0):,} MB/s = {limit:,} cells/s (8 concurrent GETs; "
            f"server {rm.get('raw_get_server_cores', '?')} + client "
            f"{rm.get('raw_get_client_cores', '?')} cores busy meanwhile){cpu_bound(rm)}"
            f"{order_bound(rm)}"
            if ok
            else why,
        ),
        reported(
            "23c",
            "remote: time to first batch, cold cache (open + first batch)",
            rm.get("cold_first_batch_s") if ok else None,
            "s",
            f"local disk {rm.get('local_first_batch_s', 0):.3f} s" if ok else why,
        ),
        reported(
            "23d",
            "remote: peak node-cache bytes, cold epoch",
            rm["cold_peak_cache_bytes"] / MB if ok else None,
            "MB",
            why,
        ),
        reported(
            "23e",
            "remote: network bytes per epoch, cold cache (warm: "
            f"{rm.get('warm_network_bytes_per_epoch', 0)} B)",
            rm["cold_network_bytes_per_epoch"] / MB if ok else None,
            "MB",
            "every shard object downloaded once" if ok else why,
        ),
    ]


def ct_crop_targets(ct: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks.ct_crop_bench import CROP_MS_TARGET, RATIO_TARGET, TARGET_POINTS

    cr = ct.get("crop") or {}
    c = cr.get("crop") or {}
    why = f"CT: {ct.get('skipped') or ct.get('error') or 'crop figure not run'}"
    big = c.get("points", 0) >= TARGET_POINTS
    if c and not big:
        why = f"volumes of {c.get('points', 0):,.0f} points: judged from {TARGET_POINTS:,} up"
    shape = "x".join(map(str, cr.get("config", {}).get("shape", ())))
    return [
        target(
            "26.4a",
            "CT loader crop=(256,256,32) + flip / no augmentation, interleaved "
            f"(>= {RATIO_TARGET:g}x)",
            cr.get("ratio") if c and big else None,
            RATIO_TARGET,
            True,
            detail=f"{shape} volumes, median {c['points']:,.0f} points; "
            + ", ".join(f"{k} {v['volumes_per_s']:.1f} volumes/s" for k, v in cr["loader"].items())
            if c and big
            else why,
        ),
        target(
            "26.4b",
            f"CT crop + flip, one ~2M-point volume, one core (<= {CROP_MS_TARGET:g} ms CPU)",
            c.get("crop_and_flip_cpu_ms") if c and big else None,
            CROP_MS_TARGET,
            False,
            unit="ms",
            detail=f"wall {c['crop_and_flip_ms']:.2f} ms; {c['speedup']:.0f}x faster than the "
            "brute-force crop (wall)"
            if c and big
            else why,
        ),
    ]


def persistent_targets(ex: dict[str, Any]) -> list[dict[str, Any]]:
    p = ex.get("persistent") or {}
    ok = "default" in p
    why = f"extras: {p.get('error') or ex.get('skipped') or 'not run'}"

    def detail(key: str) -> str:
        r = p[key]
        return (
            f"{r['cells_per_s']:,.0f} vs {p['true']['cells_per_s']:,.0f} cells/s, "
            f"{r['epochs']} epochs; one process, {p['rounds']} rounds of {p['seconds']:g} s "
            f"windows, per-round ratios {', '.join(f'{x:.2f}' for x in r['ratios'])}"
        )

    return [
        target(
            "26.5a",
            f"ShardLoader(num_workers={p.get('num_workers', 2)}) default settings / "
            "persistent_workers=True, dense, interleaved (>= 0.8x)",
            p["default"]["vs_persistent"] if ok else None,
            0.8,
            True,
            detail=detail("default") if ok else why,
        ),
        reported(
            "26.5b",
            "same, persistent_workers=False / persistent_workers=True",
            p["false"]["vs_persistent"] if ok else None,
            "x",
            detail("false") if ok else why,
        ),
    ]


def digest_targets(ex: dict[str, Any]) -> list[dict[str, Any]]:
    d = ex.get("digest") or {}
    ok = "xxh3_cpu_s" in d
    return [
        reported(
            "26.1",
            "digest check on read: xxh3-128 CPU of one window's shards / that window's decode CPU",
            d.get("xxh3_over_decode_cpu") if ok else None,
            "x",
            f"{d['window_shards']} shards, {d['stored_mb']:.0f} MB stored: xxh3-128 "
            f"{d['xxh3_cpu_s'] * 1e3:.1f} ms (sha256 {d['sha256_cpu_s'] * 1e3:.0f} ms) vs decode "
            f"{d['decode_cpu_s'] * 1e3:.0f} ms process CPU, {d['decode_wall_s'] * 1e3:.0f} ms wall "
            "(verify=False, in-process)"
            if ok
            else f"extras: {d.get('error') or ex.get('skipped') or 'not run'}",
        )
    ]


def build_targets(res: dict[str, Any], scale_json: Path = SCALE_JSON) -> list[dict[str, Any]]:
    """26.3a from this run (benchmarks/build_vs_annbatch.py); 26.3b from the last
    `make bench-scale` (docs/benchmarks/scale.json: its 2M-cell build), which is not rerun here."""
    b = res.get("build_annbatch") or {}
    ok = "ratio" in b
    try:
        scale = json.loads(scale_json.read_text())
        big = max(scale["sizes"], key=lambda s: s["n_cells"])
    except (OSError, ValueError, KeyError):
        scale, big = None, None
    return [
        target(
            "26.3a",
            "build of the main screen / annbatch's preshuffle (add_adatas), alternating "
            "processes, median of per-pair ratios (>= 2.5x)",
            b.get("ratio") if ok else None,
            2.5,
            True,
            detail=f"ours {', '.join(f'{x:.2f}' for x in b['ours_s'])} s, annbatch "
            f"{', '.join(f'{x:.2f}' for x in b['annbatch_s'])} s; --jobs {b['jobs']}"
            + (
                f"; imports before both clocks (ours: {statistics.median(b['ours_imports_s']):.2f} s)"
                if b.get("ours_imports_s")
                else ""
            )
            if ok
            else f"build vs annbatch: {b.get('skipped') or 'not run'}",
        ),
        target(
            "26.3b",
            "build at 2M cells: cells per CPU-second / the codec-bound limit's (>= 0.3x)",
            big.get("vs_limit_cpu") if big else None,
            0.3,
            True,
            detail=f"from docs/benchmarks/scale.json ({scale['date']}): build CPU "
            f"{big['build']['cpu_s']:.1f} s vs limit {big['limit_cpu_s']:.1f} s at "
            f"{big['n_cells']:,} cells"
            + (
                f"; against the floor (the limit's work in reused memory, "
                f"{big['floor_cpu_s']:.1f} s) {big['vs_floor_cpu']:.2f}x"
                if "floor_cpu_s" in big
                else ""
            )
            if big and scale
            else "no docs/benchmarks/scale.json: run `make bench-scale`",
        ),
    ]


def extra_targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    ex = res.get("extras") or {}
    return [
        *build_targets(res),
        *remote_targets(res.get("remote") or {}),
        *link_targets(res.get("remote_link") or {}),
        *ct_crop_targets(res.get("ct") or {}),
        *persistent_targets(ex),
        *digest_targets(ex),
        *(report_targets(res["report"]) if "report" in res else []),
    ]
