"""Check the ledger against known injected taxes (issue: ledger validation on real GPUs).

Input: a directory with one bundle per injection, as written by
    for inj in none sleep_rank=1:3000 extra_launches=8 extra_copy=1; do
      taxmodel profile ag_gemm -n 4 --preset m4096 --variants bsp ${inj/none/} --inject $inj -o DIR/${inj%%=*}
    done
(`none` without --inject). Prints, per injection, the change of the matching ledger part against
the baseline next to what was injected, measured from the trace itself (the sleep kernel's and
the extra copy's own durations), so the comparison does not rely on nominal values.

    python benchmarks/validate_injection.py profiles/h200x4-inject
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from taxmodel.model.ledger import compute_ledger
from taxmodel.trace.bundle import find_bundles, load_bundle


def _parts_and_kernels(root: Path) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    (path,) = find_bundles(root)
    bundle = load_bundle(path)
    ledger = compute_ledger(bundle)
    parts = ledger.parts.groupby(["rank", "subcategory"])["ns"].mean().unstack(fill_value=0) / 1e3
    ev = bundle.events
    gpu = ev[ev["kind"].isin(["kernel", "memcpy", "memset"]) & (ev["iteration"] >= 0)]
    dur = gpu.assign(us=(gpu["end_ns"] - gpu["start_ns"]) / 1e3).groupby(["rank", "name"])["us"].agg(["count", "sum"])
    iters = ledger.windows.shape[0]
    dur["per_iteration_us"] = dur["sum"] / iters
    return parts, dur, ledger.windows["window_ns"].mean() / 1e3


def main(root: str) -> None:
    root = Path(root)
    base, _, base_window = _parts_and_kernels(root / "none")
    rows = []
    sleep_parts, sleep_k, _ = _parts_and_kernels(root / "sleep_rank")
    sleeper = sleep_k[sleep_k.index.get_level_values("name").str.contains("spin_kernel")]
    slept_rank, slept_us = int(sleeper.index[0][0]), float(sleeper["per_iteration_us"].iloc[0])
    for rank in base.index:
        if rank != slept_rank:
            got = sleep_parts.loc[rank, "skew_wait"] - base.loc[rank, "skew_wait"]
            rows.append(("sleep_rank", rank, "skew_wait", slept_us, got))
    copy_parts, copy_k, _ = _parts_and_kernels(root / "extra_copy")
    copies = copy_k[copy_k.index.get_level_values("name").str.contains("Memcpy DtoD", case=False)]
    for (rank, _name), row in copies.iterrows():
        got = copy_parts.loc[rank, "locality_tax"] - base.loc[rank, "locality_tax"]
        rows.append(("extra_copy", rank, "locality_tax", float(row["per_iteration_us"]), got))
    launch_parts, launch_k, _ = _parts_and_kernels(root / "extra_launches")
    launch_subs = ["host_starved", "launch_latency", "kernel_gap"]
    for rank in base.index:
        got = launch_parts.loc[rank, launch_subs].sum() - base.loc[rank, launch_subs].sum()
        rows.append(("extra_launches", rank, "launch_tax", float("nan"), got))
    table = pd.DataFrame(rows, columns=["injection", "rank", "ledger part", "injected (us, from trace)", "ledger change (us)"])
    table["ratio"] = table["ledger change (us)"] / table["injected (us, from trace)"]
    print(f"baseline window {base_window:.1f} us")
    print(table.round(3).to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "profiles/h200x4-inject")
