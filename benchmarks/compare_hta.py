"""Side by side: taxmodel's ledger and HolisticTraceAnalysis's temporal breakdown on the Kineto
traces of the third-party corpus (tests/data/thirdparty) that both read.

HTA is not a dependency of taxmodel. Install it to run this (HTA 0.5.0 needs no torch):

    pip install --no-deps holistictraceanalysis && pip install plotly psutil networkx pydot

    python benchmarks/compare_hta.py [-o benchmarks/results/hta_comparison.md]

HTA's temporal breakdown, per rank: ``kernel_time`` = last GPU activity's end - first one's
start; ``idle`` = that minus the union of all GPU activities; ``compute`` = the union of
computation kernels; ``non_compute`` = the rest (communication, memcpy, memset). The ledger's
matching sums, per rank over its windows: idle = barrier_idle + stream_wait + launch_tax + unattributed;
communication only = skew_wait + exposed_comm; local busy = useful + compute_inefficiency +
locality_tax + flag_wait. The ledger counts copies (memcpy/memset) as local work, HTA as
non-compute, so the table also shows the copy time not under a compute kernel ("copies
only", from the bundle's events) moved to HTA's side.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
IDLE = ("barrier_idle", "stream_wait", "host_starved", "launch_latency", "kernel_gap", "unattributed")
COMM = ("skew_wait", "exposed_comm")
LOCAL = ("useful", "compute_inefficiency", "locality_tax", "flag_wait")


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of intervals."""
    if len(start) == 0:
        return 0
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum.accumulate(end[order])
    new = np.r_[True, s[1:] > e[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(s)] - 1
    return int((e[last] - s[first]).sum())


def copy_only_ns(events: pd.DataFrame, windows: pd.DataFrame, offset: int) -> int:
    """Time in the windows when a copy (memcpy/memset) runs and no compute kernel does."""
    gpu = events[events["kind"].isin(["kernel", "memcpy", "memset"])]
    s, e = gpu["start_ns"].to_numpy(np.int64) + offset, gpu["end_ns"].to_numpy(np.int64) + offset
    is_copy = gpu["role"].to_numpy(object) == "copy"
    is_comp = np.isin(gpu["role"].to_numpy(object), ["compute", "fused"])
    total = 0
    for ws, we in windows[["start_ns", "end_ns"]].itertuples(index=False):  # a handful of windows
        cs, ce = np.clip(s, ws, we), np.clip(e, ws, we)
        both = is_copy | is_comp
        total += union_ns(cs[both], ce[both]) - union_ns(cs[is_comp], ce[is_comp])
    return total


def ours(case, tmp: Path) -> pd.DataFrame:
    sys.path.insert(0, str(ROOT / "tests" / "trace"))
    from test_thirdparty_corpus import run_case

    from taxmodel.trace.bundle import load_bundle

    led = run_case(case, tmp / "bundle")
    bundle = load_bundle(tmp / "bundle")
    by = led.parts.pivot_table(index="rank", columns="subcategory", values="ns", aggfunc="sum").fillna(0)
    rows = []
    for rank, r in by.iterrows():
        ev = bundle.events[bundle.events["rank"] == rank]
        copies = copy_only_ns(ev, led.windows, int(led.clock.offsets_ns.get(int(rank), 0)))
        rows.append({"rank": int(rank), "span": float(led.windows["window_ns"].sum()),
                     "idle": float(sum(r.get(k, 0) for k in IDLE)), "comm": float(sum(r.get(k, 0) for k in COMM)),
                     "local": float(sum(r.get(k, 0) for k in LOCAL)), "copies": float(copies),
                     "windows": len(led.windows)})
    return pd.DataFrame(rows).set_index("rank") / [1e3, 1e3, 1e3, 1e3, 1e3, 1]


def hta_breakdown(case, tmp: Path) -> pd.DataFrame:
    # HTA by default shrinks every activity of a ns-resolution trace to whole microseconds
    # (start rounded up, end down); compare the times as recorded.
    os.environ.setdefault("HTA_DISABLE_NS_ROUNDING", "1")
    from hta.trace_analysis import TraceAnalysis

    d = tmp / "hta"
    d.mkdir()
    for p in case.paths():
        shutil.copy(p, d / p.name)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        df = TraceAnalysis(trace_dir=str(d)).get_temporal_breakdown(visualize=False)
    return df.set_index("rank")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, default=None, help="Write the table as markdown here.")
    args = ap.parse_args(argv)
    try:
        import hta  # noqa: F401
    except ImportError:
        print("HolisticTraceAnalysis is not installed; skipping (pip install --no-deps holistictraceanalysis "
              "&& pip install plotly psutil networkx pydot)")
        return 0
    sys.path.insert(0, str(ROOT / "tests" / "trace"))
    from test_thirdparty_corpus import CASES, LEDGER

    rows = []
    for case in CASES:
        if case.expect != LEDGER or not all(f.endswith(".json.gz") for f in case.files) or "rocprof" in case.id \
                or case.options.get("world_size"):
            continue
        with tempfile.TemporaryDirectory() as t:
            try:
                h = hta_breakdown(case, Path(t))
            except Exception as exc:  # noqa: BLE001 - HTA's own failures are part of the comparison
                rows.append({"trace": case.id, "rank": "-", "note": f"HTA failed: {type(exc).__name__}: {str(exc)[:80]}"})
                continue
            o = ours(case, Path(t))
        for rank in o.index:
            if rank not in h.index:
                continue
            hr, orow = h.loc[rank], o.loc[rank]
            rows.append({
                "trace": case.id, "rank": rank, "windows": int(orow["windows"]),
                "span ours / HTA": f"{orow['span']:,.1f} / {hr['kernel_time(us)']:,.1f}",
                "idle ours / HTA": f"{orow['idle']:,.1f} / {hr['idle_time(us)']:,.1f}",
                "compute: ours local - copies only / HTA": f"{orow['local'] - orow['copies']:,.1f} / {hr['compute_time(us)']:,.1f}",
                "non-compute: ours comm + copies only / HTA": f"{orow['comm'] + orow['copies']:,.1f} / {hr['non_compute_time(us)']:,.1f}",
                "same span": "yes" if abs(orow["span"] - hr["kernel_time(us)"]) < 0.01 else "no",
            })
    table = pd.DataFrame(rows).fillna("")
    cols = list(table.columns)
    text = "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(str(v) for v in r) + " |" for r in table.itertuples(index=False)])
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
