"""Check the ledger against known injected taxes (issue: ledger validation on real GPUs).

Input: a directory with one sub-directory per capture, as written by
    P="taxmodel profile ag_gemm -n 4 --variants bsp"
    $P --preset m4096 -o DIR/none
    $P --preset m4096 --inject sleep_rank=1:3000 -o DIR/sleep_rank
    $P --preset m4096 --inject extra_copy=1 -o DIR/extra_copy
    $P --preset m8192 -o DIR/none_m8192
    $P --preset m8192 --inject extra_launches=8 -o DIR/extra_launches_8
    $P --preset m8192 --inject extra_launches=24 -o DIR/extra_launches_24
Each injected capture is compared with the un-injected capture of the same shape (``none`` or
``none_<preset>``). Expected values never come from the ledger itself:

- sleep: the sleep kernel's own duration in the trace; the other ranks' skew_wait should rise by it.
- extra copy: the extra copy's own duration in the trace; that rank's locality_tax should rise by it.
- extra launches: K empty kernels enqueued between two kernels the GPU runs back to back. When
  the host enqueued them before the GPU got there (checked per kernel from the launch calls, and
  reported), each adds one more queued gap, so the ledger's kernel_gap should rise by
  (empty kernels per iteration) x the back-to-back kernel gap that ``taxmodel calibrate`` measured
  on its own (the hardware file, ``kernel_gap_s``). The empty kernels' own run time is not a
  launch tax by the ledger's rules (an activity of role ``other``: unattributed); it is listed.

    python benchmarks/validate_injection.py profiles/h200x4-inject [--hardware FILE] [--markdown OUT.md]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from taxmodel.hardware.specs import resolve_hardware
from taxmodel.ledger.compute import compute_ledger
from taxmodel.trace.bundle import find_bundles, load_bundle

GPU_KINDS = ("kernel", "memcpy", "memset")
LAUNCH_PARTS = ["host_starved", "launch_latency", "kernel_gap"]


@dataclass
class Capture:
    """One capture: the ledger's mean part per rank (us per iteration) and its trace."""

    parts: pd.DataFrame          # index rank, columns sub-categories, us per iteration
    gpu: pd.DataFrame            # GPU rows inside iterations, with the end of their launch call
    iterations: int              # (repetition, iteration) windows analyzed
    window_us: float
    meta: dict

    @property
    def preset(self) -> str:
        return str(self.meta.get("preset") or self.meta.get("shape_tag") or "")


def load_capture(root: Path) -> Capture:
    (path,) = find_bundles(root)
    bundle = load_bundle(path)
    ledger = compute_ledger(bundle)
    windows = ledger.windows.shape[0]
    parts = (ledger.parts.groupby(["rank", "subcategory"])["ns"].sum().unstack(fill_value=0) / 1e3 / windows)
    ev = bundle.events
    launch_end = ev[ev["kind"] == "launch"].drop_duplicates(["rank", "correlation"]).set_index(["rank", "correlation"])["end_ns"]
    gpu = ev[ev["kind"].isin(GPU_KINDS) & (ev["iteration"] >= 0)].sort_values(["rank", "start_ns"]).copy()
    keys = pd.MultiIndex.from_arrays([gpu["rank"], gpu["correlation"]])
    gpu["launch_end_ns"] = launch_end.reindex(keys).to_numpy()
    gpu["prev_end_ns"] = gpu.groupby("rank")["end_ns"].shift()
    gpu["us"] = (gpu["end_ns"] - gpu["start_ns"]) / 1e3
    return Capture(parts, gpu, windows, float(ledger.windows["window_ns"].mean() / 1e3), bundle.meta)


def per_iteration_us(cap: Capture, name_pattern: str) -> pd.DataFrame:
    """Count and total duration per rank and iteration of GPU rows whose name matches."""
    rows = cap.gpu[cap.gpu["name"].astype(str).str.contains(name_pattern, case=False, regex=True)]
    out = rows.groupby("rank")["us"].agg(["count", "sum"])
    return out / cap.iterations


def _baseline_for(captures: dict[str, Capture], name: str) -> Capture:
    cap = captures[name]
    for candidate in (f"none_{cap.preset}", "none"):
        if candidate in captures and captures[candidate].preset == cap.preset:
            return captures[candidate]
    raise SystemExit(f"{name}: no un-injected capture of preset '{cap.preset}' (expected a directory none or none_{cap.preset})")


def sleep_rows(cap: Capture, base: Capture) -> list[dict]:
    sleeper = per_iteration_us(cap, r"spin_kernel")
    slept_rank = int(sleeper["sum"].idxmax())
    slept_us = float(sleeper.loc[slept_rank, "sum"])
    return [dict(injection="sleep_rank", rank=r, part="skew_wait", expected_us=slept_us,
                 got_us=cap.parts.loc[r, "skew_wait"] - base.parts.loc[r, "skew_wait"])
            for r in cap.parts.index if r != slept_rank]


def copy_rows(cap: Capture, base: Capture) -> list[dict]:
    copies = per_iteration_us(cap, r"memcpy dtod|taxmodel_inject_copy")
    return [dict(injection="extra_copy", rank=r, part="locality_tax", expected_us=float(copies.loc[r, "sum"]),
                 got_us=cap.parts.loc[r, "locality_tax"] - base.parts.loc[r, "locality_tax"])
            for r in copies.index]


def launch_rows(cap: Capture, base: Capture, gap_s: float, label: str) -> list[dict]:
    """Expected: one calibrated queued gap per empty kernel the GPU found already enqueued."""
    empties = cap.gpu[cap.gpu["name"].astype(str).str.contains("spin_kernel", case=False)]
    queued = empties["launch_end_ns"] <= empties["prev_end_ns"]
    rows = []
    for r in cap.parts.index:
        mine = empties["rank"] == r
        n_per_iter = mine.sum() / cap.iterations
        frac = float(queued[mine].mean()) if mine.any() else float("nan")
        rows.append(dict(injection=label, rank=r, part="kernel_gap", expected_us=n_per_iter * gap_s * 1e6,
                         got_us=cap.parts.loc[r, "kernel_gap"] - base.parts.loc[r, "kernel_gap"],
                         launch_tax_change_us=cap.parts.loc[r, LAUNCH_PARTS].sum() - base.parts.loc[r, LAUNCH_PARTS].sum(),
                         unattributed_change_us=cap.parts.loc[r].get("unattributed", 0.0) - base.parts.loc[r].get("unattributed", 0.0),
                         empty_kernel_us=float(empties.loc[mine, "us"].median()) if mine.any() else float("nan"),
                         queued_fraction=frac))
    return rows


def validate(root: Path, hardware: str | None = None) -> tuple[pd.DataFrame, dict]:
    captures = {d.name: load_capture(d) for d in sorted(root.iterdir()) if d.is_dir() and find_bundles(d)}
    if not captures:
        raise SystemExit(f"{root}: no bundles")
    any_meta = next(iter(captures.values())).meta
    spec = resolve_hardware(any_meta, hardware)
    rows: list[dict] = []
    for name, cap in captures.items():
        inj = (cap.meta.get("capture") or {}).get("inject") or {}
        if name.startswith("none") or not inj:
            continue
        base = _baseline_for(captures, name)
        if inj.get("sleep_rank") is not None:
            rows += sleep_rows(cap, base)
        if inj.get("extra_copy"):
            rows += copy_rows(cap, base)
        if inj.get("extra_launches"):
            rows += launch_rows(cap, base, spec.kernel_gap_s, f"extra_launches={inj['extra_launches']} ({cap.preset})")
    table = pd.DataFrame(rows)
    table["ratio"] = table["got_us"] / table["expected_us"]
    table["within_10pct"] = (table["ratio"] - 1).abs() <= 0.10
    info = {"hardware": spec.name, "kernel_gap_us": spec.kernel_gap_s * 1e6,
            "windows_us": {n: round(c.window_us, 1) for n, c in captures.items()}}
    return table, info


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", nargs="?", default="profiles/h200x4-inject")
    p.add_argument("--hardware", default=None, help="hardware name or calibration JSON (default: the bundles' GPU)")
    p.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    args = p.parse_args(argv)
    table, info = validate(Path(args.root), args.hardware)
    print(f"hardware {info['hardware']}: calibrated back-to-back kernel gap {info['kernel_gap_us']:.3f} us")
    print("windows (us): " + ", ".join(f"{k} {v}" for k, v in info["windows_us"].items()))
    print(table.round(3).to_string(index=False))
    if args.markdown:
        Path(args.markdown).write_text(markdown(table, info))


def markdown(table: pd.DataFrame, info: dict) -> str:
    """The table as Markdown (no optional pandas dependency), with the hardware line above it."""
    t = table.round(3).astype(object).where(table.notna(), "")
    lines = [f"Hardware: {info['hardware']}; calibrated back-to-back kernel gap {info['kernel_gap_us']:.3f} us.", "",
             "| " + " | ".join(t.columns) + " |", "|" + "---|" * len(t.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in t.itertuples(index=False)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
