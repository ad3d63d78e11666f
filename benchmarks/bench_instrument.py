"""In-kernel trace records on GPUs: what they cost, and whether they tell the truth.

GPU (4 ranks, a few minutes):
    OUT=out/bench_instrument torchrun --standalone --nproc-per-node 4 benchmarks/bench_instrument.py
CPU smoke test (2 ranks, Triton interpreter, tiny shape; times mean nothing):
    TRITON_INTERPRET=1 torchrun --standalone --nproc-per-node 2 benchmarks/bench_instrument.py --cpu

For each size, the fused flash decode kernel twice in the same run, plain (``INSTRUMENT=False``)
and instrumented (records on), over the same inputs:
1. Overhead: ``--iters`` back-to-back eager steps timed with CUDA events (max over ranks), plain
   and instrumented interleaved, ``--reps`` times; medians and their ratio (target: < 3 %).
2. Consistency: one instrumented step under torch.profiler; the records are drained, aligned to
   the trace's kernel (taxmodel.runtime.records.merge_records) and checked: each CTA's phases sum
   to its lifetime, every CTA lies inside the kernel, the records' span fits in the kernel's
   duration; the alignment residual is reported.
3. A late producer: step 0 as is, step 1 with rank 1 sleeping ``--delay-us`` on the GPU before its
   kernel; the consumers' (ranks != 1) largest per-combiner flag_wait in step 1, minus step 0's,
   should be about the delay.

The AG+GEMM push kernel is not instrumented yet (kernels/ag_gemm was being rewritten); it is
listed as such in the results.

Results: results.json and results.md under ``$OUT`` (or ``--out``); rank 0 prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_flash_decode import _ensure_taxmodel_kernels, all_max, init  # noqa: E402

GPU_SIZES = ["b16-kv16k", "b1-kv16k", "b16-kv64k", "b16-kv1k"]
CPU_SIZES = ["tiny"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--sizes", default=None)
    p.add_argument("--iters", type=int, default=None, help="steps per timed batch")
    p.add_argument("--reps", type=int, default=None, help="timed batches per variant (median reported)")
    p.add_argument("--delay-us", type=float, default=200.0)
    p.add_argument("--spin-timeout", type=float, default=30.0)
    p.add_argument("--out", default=os.environ.get("OUT", "out/bench_instrument"))
    return p.parse_args(argv)


def _step(wl: Any, variant: Any, state: Any) -> None:
    variant.run(state)


def _batch_ms(ctx: Any, wl: Any, variant: Any, state: Any, iters: int) -> float:
    """Per-step time of ``iters`` back-to-back steps (ms), the maximum over ranks."""
    book = getattr(ctx, "records", None) if state.impl.records is not None else None
    if book is not None:
        book.arm(iters)  # the per-step buffers the profile uses, allocated outside the timing
    ctx.barrier()
    if ctx.is_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    else:
        import time
        t0 = time.perf_counter()
    for i in range(iters):
        if book is not None:
            book.set_iteration(i)
        variant.run(state)
    if ctx.is_cuda:
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / iters
    else:
        ms = (time.perf_counter() - t0) * 1e3 / iters
    if book is not None:
        book.drain(ctx.rank)
    return all_max(ms, ctx)


def _traced_step(ctx: Any, variant: Any, state: Any, sleep_us: float = 0.0):
    """One instrumented step under torch.profiler: (kernel rows of this rank, drained records)."""
    from torch.profiler import record_function

    from taxmodel.runtime.records import merge_records
    from taxmodel.runtime.timing import gpu_sleep
    from taxmodel.trace.capture import TorchTracer, finish_events

    book = ctx.records
    book.arm(1)
    ctx.barrier()
    tracer = TorchTracer(ctx.device)
    with tracer:
        book.set_iteration(0)
        with record_function("ProfilerStep#0"):
            if sleep_us:
                gpu_sleep(sleep_us, ctx.device)
            variant.run(state)
            ctx.synchronize()
    raw = tracer.export()
    rec = book.drain(ctx.rank)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"rank{ctx.rank}.json.gz"
        path.write_bytes(raw)
        events, _ = TorchTracer.read([path])
    from taxmodel.kernels.flash_decode import fused

    events = finish_events([events], {fused.KERNEL_NAME: "fused"}, emulated=not ctx.is_cuda)
    events = events.assign(rank=ctx.rank)
    merged, info = merge_records(events, rec.assign(rank=ctx.rank))
    return merged, rec, info


def _consistency(merged, info) -> dict:
    from taxmodel.kernels.flash_decode import fused

    kern = merged[(merged["kind"] == "kernel") & (merged["name"] == fused.KERNEL_NAME) & (merged["iteration"] == 0)]
    rec = merged[merged["kind"] == "record"]
    if kern.empty or rec.empty:
        return {"ok": False, "why": f"{len(kern)} kernel rows, {len(rec)} aligned records", **info}
    ks, ke = int(kern["start_ns"].min()), int(kern["end_ns"].max())
    per_cta = rec.groupby("cta").agg(first=("start_ns", "min"), last=("end_ns", "max"))
    per_cta["sum"] = (rec["end_ns"] - rec["start_ns"]).groupby(rec["cta"]).sum()
    life = per_cta["last"] - per_cta["first"]
    return {
        "ok": bool((per_cta["sum"] == life).all() and (per_cta["first"] >= ks).all() and (per_cta["last"] <= ke).all()
                   and info["spans_longer_than_kernel"] == 0),
        "kernel_us": (ke - ks) / 1e3,
        "record_span_us": float((per_cta["last"].max() - per_cta["first"].min()) / 1e3),
        "ctas": int(len(per_cta)),
        "max_phase_sum_minus_life_ns": int((per_cta["sum"] - life).abs().max()),
        "alignment_residual_ns": info["residual_ns"], "spans_longer_than_kernel": info["spans_longer_than_kernel"],
    }


def _max_combiner_wait_us(rec) -> float:
    w = rec[rec["phase"] == "flag_wait"]
    if w.empty:
        return 0.0
    return float((w["end_ns"] - w["start_ns"]).groupby(w["cta"]).sum().max() / 1e3)


def bench_size(ctx: Any, preset: str, args: argparse.Namespace) -> dict:
    from taxmodel.runtime.workload import get_workload

    wl = get_workload("flash_decode")
    v = wl.variants()["fused"]
    shape = wl.shape(preset)
    ctx.heap.reset()
    ctx.instrument = False
    plain = wl.setup(ctx, shape, v)
    ctx.instrument = True
    inst = wl.setup(ctx, shape, v)
    for st in (plain, inst):  # warm-up and correctness, both builds
        for _ in range(2):
            v.run(st)
        ctx.synchronize()
        ref = wl.reference(ctx, shape, st)
        ok = bool(torch.allclose(wl.output(st).float(), ref, rtol=2e-2, atol=2e-2))
        if not ok:
            raise RuntimeError(f"{preset}: wrong output ({'instrumented' if st is inst else 'plain'})")
    times: dict[str, list[float]] = {"plain": [], "instrumented": []}
    for _ in range(args.reps):
        times["plain"].append(_batch_ms(ctx, wl, v, plain, args.iters))
        times["instrumented"].append(_batch_ms(ctx, wl, v, inst, args.iters))
    med = {k: statistics.median(x) for k, x in times.items()}
    merged, _, info = _traced_step(ctx, v, inst)
    cons = _consistency(merged, info)
    # a late producer: rank 1 sleeps on its GPU before the kernel
    _, rec0, _ = _traced_step(ctx, v, inst)
    _, rec1, _ = _traced_step(ctx, v, inst, sleep_us=args.delay_us if ctx.rank == 1 else 0.0)
    extra = _max_combiner_wait_us(rec1) - _max_combiner_wait_us(rec0)
    extras = [None] * ctx.world_size
    dist.all_gather_object(extras, extra)
    consumers = [e for r, e in enumerate(extras) if r != 1]
    conss = [None] * ctx.world_size
    dist.all_gather_object(conss, cons)
    return {
        "size": preset, "shape": shape, "plain_ms": med["plain"], "instrumented_ms": med["instrumented"],
        "overhead_pct": (med["instrumented"] / med["plain"] - 1.0) * 100.0,
        "plain_all_ms": times["plain"], "instrumented_all_ms": times["instrumented"],
        "consistency": conss, "consistent": all(c["ok"] for c in conss),
        "delay_us": args.delay_us, "consumer_extra_wait_us": consumers,
        "delay_seen": bool(consumers) and all(abs(e - args.delay_us) <= 0.25 * args.delay_us + 20.0 for e in consumers),
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# In-kernel records: overhead and consistency ({meta['device']}, {meta['world_size']} ranks)", "",
             "| size | plain ms | instrumented ms | overhead | phases = lifetime, inside kernel | "
             "delay | consumers' extra flag_wait (us) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['plain_ms']:.4f} | {r['instrumented_ms']:.4f} | {r['overhead_pct']:+.2f} % | "
                     f"{'yes' if r['consistent'] else 'NO'} | {r['delay_us']:.0f} us | "
                     f"{', '.join(f'{e:.1f}' for e in r['consumer_extra_wait_us'])} |")
    lines += ["", "ag_gemm push: not instrumented yet (no records), not measured.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _ensure_taxmodel_kernels()
    ctx = init(args)
    args.iters = args.iters or (2 if args.cpu else 50)
    args.reps = args.reps or (2 if args.cpu else 15)
    sizes = args.sizes.split(",") if args.sizes else (CPU_SIZES if args.cpu else GPU_SIZES)
    rows = []
    for preset in sizes:
        row = bench_size(ctx, preset, args)
        rows.append(row)
        if ctx.rank == 0:
            print(f"{preset}: plain {row['plain_ms']:.4f} ms, instrumented {row['instrumented_ms']:.4f} ms "
                  f"({row['overhead_pct']:+.2f} %), consistent={row['consistent']}, "
                  f"extra flag_wait on consumers {row['consumer_extra_wait_us']} us for a {args.delay_us} us delay",
                  flush=True)
    if ctx.rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name() if ctx.is_cuda else "cpu (interpreter)",
                "world_size": ctx.world_size, "iters": args.iters, "reps": args.reps,
                "torch": torch.__version__}
        (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str) + "\n")
        md = markdown(rows, meta)
        (out / "results.md").write_text(md)
        print(md)
    ctx.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
