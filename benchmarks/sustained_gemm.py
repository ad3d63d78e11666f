"""Does a GPU slow down when it computes for long? cuBLAS GEMMs back to back, each call timed.

A profile traces a few steps after a short warm-up; a benchmark or a serving loop runs its steps
back to back for much longer. Where the GPU lowers its clocks under sustained load (a power or
thermal limit), the two see different step times for the same kernels. This script measures that
directly on one GPU: for each shape, after a pause, the GEMM runs back to back for ``--seconds``,
every call between two CUDA events (nothing else between calls, no host sync), and the per-call
times are reported against the time elapsed since the first call (1-2 ms windows of a profile, tens
of ms of a benchmark's sample, the seconds of a job).

    python benchmarks/sustained_gemm.py --shapes 8192x8192x8192,1024x8192x8192 --seconds 2
    python benchmarks/sustained_gemm.py --cpu          # a smoke test of the bookkeeping

Writes ``--out`` (JSON: per shape, every call's ms and start ms) and prints a table: the median call
time in windows of elapsed time, relative to the first window. Run ``nvidia-smi --query-gpu=clocks.sm,
power.draw,temperature.gpu --format=csv -lms 50`` beside it to see the clocks that explain it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

#: Windows of elapsed time (ms since the first call) in which the call times are summarized.
WINDOWS_MS = ((0, 2), (2, 10), (10, 50), (50, 200), (200, 1000), (1000, 3000), (3000, 10000))


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes: '{text}' is not MxNxK (e.g. 8192x8192x8192)") from None
    if min(m, n, k) < 1:
        raise SystemExit(f"--shapes: '{text}' has a dimension below 1")
    return m, n, k


def back_to_back(fn, device: torch.device, seconds: float, max_calls: int) -> tuple[list[float], list[float]]:
    """Calls of ``fn`` back to back for about ``seconds``: (each call's ms, each call's start in ms
    after the first call's). On CPU the host clock times each call."""
    if device.type != "cuda":
        times, starts, t0 = [], [], time.perf_counter()
        while len(times) < max_calls and (time.perf_counter() - t0) < seconds:
            s = time.perf_counter()
            fn()
            times.append((time.perf_counter() - s) * 1e3)
            starts.append((s - t0) * 1e3)
        return times, starts
    # one call's length, to queue about ``seconds`` of them without a host wait in between
    probe = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    probe[0].record()
    fn()
    probe[1].record()
    probe[1].synchronize()
    per_call = max(probe[0].elapsed_time(probe[1]), 1e-3)
    calls = int(min(max_calls, max(8, seconds * 1e3 / per_call)))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
    events[0].record()
    for i in range(calls):
        fn()
        events[i + 1].record()
    events[-1].synchronize()
    times = [events[i].elapsed_time(events[i + 1]) for i in range(calls)]
    starts, acc = [], 0.0
    for t in times:
        starts.append(acc)
        acc += t
    return times, starts


def summarize(times: list[float], starts: list[float]) -> list[dict]:
    """Median call time per window of elapsed time; ``vs_first``: against the first window's median."""
    rows = []
    for lo, hi in WINDOWS_MS:
        sel = [t for t, s in zip(times, starts) if lo <= s < hi]
        if sel:
            rows.append({"window_ms": [lo, hi], "calls": len(sel), "median_ms": statistics.median(sel)})
    first = rows[0]["median_ms"] if rows else float("nan")
    for r in rows:
        r["vs_first"] = r["median_ms"] / first if first else float("nan")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="8192x8192x8192,1024x8192x8192", help="comma-separated MxNxK")
    p.add_argument("--seconds", type=float, default=2.0, help="how long each shape runs back to back")
    p.add_argument("--pause", type=float, default=2.0, help="idle seconds before each shape (the GPU cools)")
    p.add_argument("--max-calls", type=int, default=20000)
    p.add_argument("--cpu", action="store_true", help="smoke test on CPU (tiny float32 shapes)")
    p.add_argument("--out", default="out/sustained_gemm.json")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.pause < 0:
        raise SystemExit("--seconds must be > 0 and --pause >= 0")
    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()]
    if device.type == "cpu":
        shapes = [(min(m, 64), min(n, 64), min(k, 64)) for m, n, k in shapes]
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "seconds": args.seconds, "pause": args.pause, "shapes": []}
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        c = torch.empty(m, n, device=device, dtype=dtype)

        def gemm() -> None:
            torch.matmul(a, b, out=c)

        for _ in range(3):
            gemm()
        if device.type == "cuda":
            torch.cuda.synchronize()
        time.sleep(args.pause)
        times, starts = back_to_back(gemm, device, args.seconds, args.max_calls)
        rows = summarize(times, starts)
        result["shapes"].append({"M": m, "N": n, "K": k, "calls": len(times), "summary": rows,
                                 "times_ms": [round(t, 5) for t in times]})
        print(f"{m}x{n}x{k}: {len(times)} calls over {sum(times):.0f} ms")
        for r in rows:
            lo, hi = r["window_ms"]
            print(f"  {lo:>5}-{hi:<5} ms: {r['calls']:>5} calls, median {r['median_ms']:.4f} ms, x{r['vs_first']:.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
