"""Issue 24's locality proof, from what the H200 measured: writes locality_h200.json and .md.

Inputs (committed): ``benchmarks/results/locality_h200/`` (the standalone benchmark's timings,
its per-kernel and per-range ncu exports) and ``profiles/h200x1-locality/`` (the same chain
profiled by ``taxmodel profile --counters``). Two computations of the unfused chain's locality
tax, each against the measured time it costs (unfused − fused):

1. **the tool's ledger** (docs/ledger.md 5b, measured locality): ``taxmodel analyze`` on the
   profiled bundles, hardware ``h200`` (calibrated HBM bandwidth); its analytic (estimated)
   locality, from the declared intermediate, is recomputed on the same bundles with the
   counters removed, as the prediction;
2. **the issue's formula** on the standalone benchmark: DRAM bytes of the chain beyond its
   compulsory bytes (x read, z written) at the achievable HBM bandwidth (a device copy measured
   in the same run), per kernel (kernel replay) and per whole chain (range replay).

    python benchmarks/locality_report.py      # from the repo root
"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "benchmarks" / "results" / "locality_h200"
BUNDLES = ROOT / "profiles" / "h200x1-locality" / "locality_chain"
OUT = ROOT / "benchmarks" / "results" / "locality_h200"
TARGET = 0.15


def ledger_rows() -> list[dict]:
    from taxmodel.hardware.specs import resolve_hardware
    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.bundle import Bundle, load_bundle

    hw = None
    rows = []
    for path in sorted(BUNDLES.iterdir()):
        b = load_bundle(path)
        hw = hw or resolve_hardware(b.meta, "h200-calibrated")
        led = compute_ledger(b, hardware=hw)
        cat = _by_category(led)
        ev = b.events.copy()
        ev["dram_read_bytes"] = -1
        ev["dram_write_bytes"] = -1
        est = compute_ledger(Bundle(events=ev, meta=b.meta, path=None), hardware=hw)
        kern = b.events[(b.events["kind"] == "kernel") & (b.events["iteration"] >= 0)]
        steps = kern.groupby(["repetition", "iteration"]).ngroups
        rows.append({"bundle": path.name, "variant": b.meta["variant"], "N": int(b.meta["shape"]["N"]),
                     "locality_mode": led.locality, "estimated_mode": est.locality,
                     "window_us": float(led.windows["window_ns"].mean()) / 1e3,
                     "locality_tax_us": float(cat.get("locality_tax", 0.0)) / 1e3,
                     "estimated_locality_tax_us": float(_by_category(est).get("locality_tax", 0.0)) / 1e3,
                     "dram_bytes_per_step": int((kern["dram_read_bytes"] + kern["dram_write_bytes"]).sum() // steps),
                     "compulsory_bytes": int(b.meta["cost"]["hbm_bytes"]), "hbm_bytes_per_s": hw.hbm_bytes_per_s,
                     "counters_pass_s": b.meta["counters"]["pass_wall_s"]})
    return rows


def _by_category(ledger) -> dict:
    summary = ledger.category_summary()
    return dict(zip(summary["category"], summary["mean_ns"]))


def formula_rows() -> list[dict]:
    from taxmodel.trace.ncu import read_counters

    timing = json.loads((RAW / "locality_time.json").read_text())
    bw = timing["copy_bandwidth_Bps"]
    kern = read_counters(RAW / "locality_ncu.csv")
    rng = read_counters(RAW / "locality_ncu_range.csv")
    rows = []
    for i, size in enumerate(timing["sizes"]):
        k = kern.iloc[3 * i:3 * i + 3]  # axpb, relu, fused (bench_locality --mode ncu order)
        assert list(k["name"]) == ["axpb_kernel", "relu_kernel", "fused_kernel"], list(k["name"])
        r = rng.iloc[2 * i:2 * i + 2]  # one range per chain: unfused, fused
        comp = size["compulsory_bytes"]
        moved = {"kernel_unfused": int((k.iloc[:2]["dram_read_bytes"] + k.iloc[:2]["dram_write_bytes"]).sum()),
                 "kernel_fused": int(k.iloc[2]["dram_read_bytes"] + k.iloc[2]["dram_write_bytes"]),
                 "range_unfused": int(r.iloc[0]["dram_read_bytes"] + r.iloc[0]["dram_write_bytes"]),
                 "range_fused": int(r.iloc[1]["dram_read_bytes"] + r.iloc[1]["dram_write_bytes"])}
        tax = {key: max(0, v - comp) / bw * 1e6 for key, v in moved.items()}
        rows.append({"intermediate_bytes": size["intermediate_bytes"], "compulsory_bytes": comp, "copy_bandwidth_Bps": bw,
                     "unfused_us": size["unfused"]["median_ns"] / 1e3, "fused_us": size["fused"]["median_ns"] / 1e3,
                     "diff_us": size["diff_median_ns"] / 1e3, "rounds": size["rounds"], "chains_per_round": size["calls_per_round"],
                     "dram_bytes": moved, "tax_us": tax})
    return rows


def main() -> None:
    led, form = ledger_rows(), formula_rows()
    by = {(r["N"], r["variant"]): r for r in led}
    checks = []
    for n in sorted({r["N"] for r in led}):
        u, f = by[(n, "unfused")], by[(n, "fused")]
        diff = u["window_us"] - f["window_us"]
        err = (u["locality_tax_us"] - diff) / diff
        checks.append({"intermediate_bytes": 4 * n, "unfused_window_us": u["window_us"], "fused_window_us": f["window_us"],
                       "measured_saving_us": diff, "ledger_locality_tax_us": u["locality_tax_us"],
                       "fused_locality_tax_us": f["locality_tax_us"], "estimated_locality_tax_us": u["estimated_locality_tax_us"],
                       "error": err, "above_l2": 4 * n > 60 * 2**20,
                       "within_15pct": abs(err) <= TARGET if 4 * n > 60 * 2**20 else None})
    doc = {"device": "NVIDIA H200 (nvidia-h200), driver 580.159.04, torch 2.11.0+cu130, Triton 3.6.0, ncu 2025.3.1",
           "ledger": led, "checks": checks, "standalone": form}
    (OUT.parent / "locality_h200.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = ["| intermediate | unfused window | fused window | measured saving | ledger locality tax (measured) | error | analytic (estimated) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for c in checks:
        lines.append(f"| {c['intermediate_bytes'] / 2**20:.0f} MiB | {c['unfused_window_us']:.1f} us | {c['fused_window_us']:.1f} us | "
                     f"{c['measured_saving_us']:.1f} us | {c['ledger_locality_tax_us']:.2f} us | {c['error'] * 100:+.1f}% | "
                     f"{c['estimated_locality_tax_us']:.1f} us |")
    lines += ["", "| intermediate | unfused | fused | saving | tax, per-kernel bytes | tax, per-range bytes | DRAM bytes unfused (kernel / range) | fused (kernel / range) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in form:
        d, t = r["dram_bytes"], r["tax_us"]
        lines.append(f"| {r['intermediate_bytes'] / 2**20:.0f} MiB | {r['unfused_us']:.2f} us | {r['fused_us']:.2f} us | {r['diff_us']:.2f} us | "
                     f"{t['kernel_unfused']:.1f} us | {t['range_unfused']:.1f} us | {d['kernel_unfused'] / 1e6:.1f} / {d['range_unfused'] / 1e6:.1f} MB | "
                     f"{d['kernel_fused'] / 1e6:.1f} / {d['range_fused'] / 1e6:.1f} MB |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
