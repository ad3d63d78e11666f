"""Benchmark: time and peak memory of compute_ledger on a 4-rank bundle with one million kernels
(plus their one million launch calls), and optionally HolisticTraceAnalysis on the same trace.

    python benchmarks/bench_ledger.py                 # taxmodel only
    python benchmarks/bench_ledger.py --hta           # also HTA (pip install holistictraceanalysis)
    python benchmarks/bench_ledger.py --kernels 100000

Not a test: numbers depend on the machine. Results measured so far: benchmarks/RESULTS.md.
The bundle is built first and written to disk; each measurement then runs in a fresh process so
that peak memory (tracemalloc peak and the process's max RSS) belongs to that step alone.
"""
from __future__ import annotations

import argparse
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build(out: Path, kernels: int, world_size: int) -> None:
    from taxmodel.trace.bundle import write_bundle
    from taxmodel.testing.synthetic import large_synthetic_bundle

    b = large_synthetic_bundle(world_size=world_size, kernels=kernels)
    write_bundle(out / "bundle", b.events, b.meta)


def run_ledger(out: Path) -> dict:
    import tracemalloc

    from taxmodel.ledger.compute import compute_ledger
    from taxmodel.trace.bundle import load_bundle

    bundle = load_bundle(out / "bundle")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    led = compute_ledger(bundle)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kernels = int((bundle.events["kind"] == "kernel").sum())
    return {"tool": "taxmodel compute_ledger", "kernels": kernels, "rows": len(bundle.events), "seconds": dt, "cpu_seconds": cpu,
            "tracemalloc_peak_mb": peak / 2**20, "max_rss_mb": rss1 / 1024, "rss_before_mb": rss0 / 1024,
            "windows": len(led.windows), "intervals": len(led.intervals)}


def export_kineto(out: Path) -> None:
    """One Kineto-like JSON per rank (kernels, runtime launches, ProfilerStep ranges) for HTA."""

    from taxmodel.trace.bundle import load_bundle

    ev = load_bundle(out / "bundle").events
    d = out / "kineto"
    d.mkdir(exist_ok=True)
    for r, g in ev.groupby("rank"):
        trace = []
        k = g[g["kind"] == "kernel"]
        ln = g[g["kind"] == "launch"]
        for df, cat, extra in ((k, "kernel", True), (ln, "cuda_runtime", False)):
            ts = df["start_ns"].to_numpy() / 1e3
            dur = (df["end_ns"] - df["start_ns"]).to_numpy() / 1e3
            names = df["name"].to_numpy()
            corr = df["correlation"].to_numpy()
            for i in range(len(df)):  # export only, not measured
                e = {"ph": "X", "cat": cat, "name": str(names[i]), "ts": float(ts[i]), "dur": float(dur[i]),
                     "pid": 0 if extra else 100, "tid": 7 if extra else 1,
                     "args": {"correlation": int(corr[i]), "External id": int(corr[i])}}
                if extra:
                    e["args"].update({"stream": 7, "device": 0})
                trace.append(e)
        steps = g[g["kind"] == "launch"].groupby("iteration").agg(s=("start_ns", "min"), e=("end_ns", "max"))
        for it, row in steps.iterrows():
            trace.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{it}", "ts": row.s / 1e3,
                          "dur": (row.e - row.s) / 1e3, "pid": 100, "tid": 1, "args": {}})
        doc = {"schemaVersion": 1, "distributedInfo": {"rank": int(r), "world_size": int(ev["rank"].nunique()), "backend": "nccl"},
               "deviceProperties": [], "traceEvents": trace, "displayTimeUnit": "ms", "baseTimeNanoseconds": 0}
        with gzip.open(d / f"rank{r}.json.gz", "wt") as f:
            json.dump(doc, f)


def run_hta(out: Path) -> dict:
    import tracemalloc

    from hta.trace_analysis import TraceAnalysis

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    c0 = time.process_time()
    t0 = time.perf_counter()
    analyzer = TraceAnalysis(trace_dir=str(out / "kineto"))
    t_parse = time.perf_counter() - t0
    t1 = time.perf_counter()
    temporal = analyzer.get_temporal_breakdown(visualize=False)
    t_temporal = time.perf_counter() - t1
    t2 = time.perf_counter()
    idle = analyzer.get_idle_time_breakdown(visualize=False)
    t_idle = time.perf_counter() - t2
    cpu = time.process_time() - c0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # HTA parses ranks in worker processes
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"tool": "HolisticTraceAnalysis", "cpu_seconds": cpu,
            "children_cpu_seconds": children.ru_utime + children.ru_stime, "children_max_rss_mb": children.ru_maxrss / 1024, "parse_seconds": t_parse, "temporal_seconds": t_temporal,
            "idle_seconds": t_idle, "seconds": t_parse + t_temporal + t_idle, "tracemalloc_peak_mb": peak / 2**20,
            "max_rss_mb": rss1 / 1024, "rss_before_mb": rss0 / 1024, "temporal_rows": len(temporal),
            "idle_rows": len(idle[0]) if isinstance(idle, tuple) else len(idle)}


def _child(step: str, out: str) -> dict:
    res = subprocess.run([sys.executable, __file__, "--step", step, "--out", out], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{step} failed:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--hta", action="store_true", help="also run HolisticTraceAnalysis on the same trace")
    ap.add_argument("--out", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--step", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step:
        out = Path(args.out)
        result = {"build": lambda: build(out, args.kernels, args.world_size), "ledger": lambda: run_ledger(out),
                  "export": lambda: export_kineto(out), "hta": lambda: run_hta(out)}[args.step]()
        print(json.dumps(result or {}))
        return
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as tmp:
        out = args.out or tmp
        t0 = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--step", "build", "--out", out, "--kernels", str(args.kernels),
                        "--world-size", str(args.world_size)], check=True)
        print(f"built bundle in {time.perf_counter() - t0:.1f} s", flush=True)
        print(json.dumps(_child("ledger", out)), flush=True)
        if args.hta:
            _child("export", out)
            print(json.dumps(_child("hta", out)), flush=True)


if __name__ == "__main__":
    main()
