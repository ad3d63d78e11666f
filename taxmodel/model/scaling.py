"""How the taxes and the fine-grained speedup change with the world size, from real bundles
(``taxmodel scaling``).

For every (workload, shape, capture mode) captured at several world sizes, one row per world
size: the bulk-synchronous variant's latency and its taxes (the ledger's mean per iteration, as
`taxmodel analyze` prints them), the fastest fine-grained variant and its latency, and the
speedup bsp / fine-grained. Beside the measured speedup, the analytic model's prediction of it
(`taxmodel predict` with the committed fitted parameters; the capture mode of the bundles).

    taxmodel scaling profiles/h200x4-graph-gate profiles/h200x8-graph-gate profiles/h200x4 profiles/h200x8

Shapes are compared as captured: AG+GEMM and GEMM+RS presets fix the global M, so a rank's share
halves from 4 to 8 GPUs; Flash Decode presets fix the KV length per rank, so the sequence doubles.
"""
from __future__ import annotations

from collections import defaultdict

from taxmodel.model.analytic.fitted import fitted_for
from taxmodel.model.case_store import find_cases
from taxmodel.model.cases import Case, predict_case

BSP = "bsp"
TAXES = ("bsp_tax", "locality_tax", "launch_tax")


def _predicted_us(case: Case, fitted: dict[str, dict[str, float]]) -> float:
    """The model's latency for ``case`` with the committed fits of its hardware (``fitted`` caches
    them per hardware name)."""
    if case.hardware.name not in fitted:
        fitted[case.hardware.name] = fitted_for(case.hardware.name)[0]
    return predict_case(case, fitted[case.hardware.name]).window_ns / 1e3


def scaling_rows(dirs: list[str]) -> list[dict]:
    """One row per (workload, shape, capture mode, world size) that has the bsp variant and at least
    one fine-grained variant, keeping only groups measured at two or more world sizes."""
    cases: list[Case] = []
    for d in dirs:
        found, _ = find_cases(d)
        cases += found
    groups: dict[tuple, dict[int, dict[str, Case]]] = defaultdict(lambda: defaultdict(dict))
    for c in cases:
        groups[(c.workload, c.shape_label, c.launches)][c.world_size][c.variant] = c
    rows, fitted = [], {}
    for (wl, shape, mode), by_world in sorted(groups.items()):
        usable = {w: v for w, v in by_world.items() if BSP in v and len(v) > 1}
        if len(usable) < 2:
            continue
        for w, variants in sorted(usable.items()):
            bsp = variants[BSP]
            fine = min((c for name, c in variants.items() if name != BSP), key=lambda c: c.measured["latency"])
            lat_b, lat_f = bsp.measured["latency"] / 1e3, fine.measured["latency"] / 1e3
            pred_b, pred_f = _predicted_us(bsp, fitted), _predicted_us(fine, fitted)
            rows.append({"workload": wl, "shape": shape, "mode": mode, "world": w, "bsp_us": lat_b,
                         **{t: 100.0 * bsp.measured.get(t, 0.0) / bsp.measured["latency"] for t in TAXES},
                         "fine": fine.variant, "fine_us": lat_f, "speedup": lat_b / lat_f,
                         "predicted_speedup": pred_b / pred_f})
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| workload | shape | launches | W | bsp us | bsp tax % | locality % | launch % | fastest fine-grained | "
            "its us | speedup | predicted speedup |\n|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|\n")
    body = "".join(
        f"| {r['workload']} | {r['shape']} | {r['mode']} | {r['world']} | {r['bsp_us']:.1f} | {r['bsp_tax']:.1f} | "
        f"{r['locality_tax']:.1f} | {r['launch_tax']:.1f} | {r['fine']} | {r['fine_us']:.1f} | {r['speedup']:.2f}x | "
        f"{r['predicted_speedup']:.2f}x |\n" for r in rows)
    return head + body
