"""Where a traced graph step's extra time goes: the kernel tracer's cost at kernel boundaries, the
per-step graph launch, or the window (issue 33, item 3).

GPU (2 ranks, about a minute):
    OUT=out/tracer_cost torchrun --nproc-per-node 2 benchmarks/tracer_cost_graph.py --spin-timeout 5
CPU smoke test (no GPU trace: only checks that the script runs):
    TRITON_INTERPRET=1 torchrun --nproc-per-node 2 benchmarks/tracer_cost_graph.py --cpu

Per case (a workload's variant at a preset), with a one-step graph G1 and a graph of ``--steps``
steps Gn captured from the same state, rounds interleaved (``--rounds``), every sample after a host
barrier and the device gate (as a traced repetition starts):

- ``unprofiled``: G1 and Gn replays timed with CUDA events, nothing traced; one step is
  ``(Gn - G1) / (steps - 1)`` (the capture's own reference, ``capture.replay_step_us``).
- ``traced_per_step``: under torch.profiler (CPU and CUDA activities, as ``taxmodel profile``'s
  tracer), one G1 replay to warm up, then ``steps`` G1 replays enqueued back to back (the default
  capture, ``--align back-to-back``).
- ``traced_one_graph``: under the same tracer, one G1 replay, then one Gn replay: the steps back to
  back inside one graph, as the reference runs them.
- ``traced_cuda_only``: as ``traced_per_step`` with the CUDA activity alone.

From each trace, per rank: the step's kernels (the gate's excluded; steps are told apart by kernel
order, every step launching the same kernels), each step's window (first kernel start to last kernel
end), the period between steps' first kernels (inside one graph), the gaps between a step's
kernels, and each kernel's duration. Written: ``tracer_cost.json`` under ``$OUT`` (rank 0).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness import init as harness_init  # noqa: E402

GPU_CASES = ("flash_decode:bsp:b16-kv1k", "flash_decode:fused:b16-kv1k", "flash_decode:bsp:b1-kv16k",
             "ag_gemm:bsp:m1024", "gemm_rs:bsp:m1024")
CPU_CASES = ("flash_decode:bsp:tiny",)
GATE_KERNEL = "taxmodel_gate_kernel"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=None, help="comma-separated workload:variant:preset (default: "
                   + ",".join(GPU_CASES) + ")")
    p.add_argument("--steps", type=int, default=5, help="steps per traced repetition and in the long graph")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every measurement")
    p.add_argument("--spin-timeout", type=float, default=5.0, help="seconds an in-kernel wait may spin")
    p.add_argument("--cpu", action="store_true", help="Triton's interpreter on CPU ranks (smoke test)")
    p.add_argument("--out", default=os.environ.get("OUT", "out/tracer_cost"))
    return p.parse_args(argv)


def kernel_rows(prof: Any) -> list[tuple[str, int, int]]:
    """(name, start ns, end ns) of every GPU kernel in a finished torch.profiler session, in start
    order, as taxmodel's Kineto importer reads the exported trace."""
    from taxmodel.trace import kineto

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events, _ = kineto.read([path])
    ker = events[events["kind"] == "kernel"].sort_values("start_ns")
    return [(str(n), int(s), int(e)) for n, s, e in zip(ker["name"], ker["start_ns"], ker["end_ns"])]


def split_steps(rows: list[tuple[str, int, int]], steps: int) -> list[list[tuple[str, int, int]]]:
    """The last ``steps`` steps' kernels: those after the device gate's (the host barrier before it
    runs kernels of its own), every step launching the same number."""
    gates = [i for i, r in enumerate(rows) if GATE_KERNEL in r[0]]
    if not gates:
        raise RuntimeError("no device gate kernel in the trace")
    rows = rows[gates[-1] + 1:]
    per = len(rows) // (steps + 1)  # one warm-up step before the traced ones
    if per == 0 or per * (steps + 1) != len(rows):
        raise RuntimeError(f"{len(rows)} kernels do not split into {steps + 1} equal steps: "
                           + ", ".join(r[0][:30] for r in rows))
    return [rows[(i + 1) * per:(i + 2) * per] for i in range(steps)]


def describe(steps: list[list[tuple[str, int, int]]]) -> dict[str, Any]:
    """Windows, periods, in-step gaps and kernel durations (us) of one rank's traced steps."""
    windows = [(s[-1][2] - s[0][1]) / 1e3 for s in steps]
    periods = [(b[0][1] - a[0][1]) / 1e3 for a, b in zip(steps, steps[1:])]
    gaps = [[(k2[1] - k1[2]) / 1e3 for k1, k2 in zip(s, s[1:])] for s in steps]
    durations = [[(e - b) / 1e3 for _, b, e in s] for s in steps]
    return dict(kernels=[n[:60] for n, _, _ in steps[0]], windows_us=windows, periods_us=periods, gaps_us=gaps,
                durations_us=durations, first_start_ns=[s[0][1] for s in steps], last_end_ns=[s[-1][2] for s in steps])


def run_case(ctx: Any, case: str, args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    from taxmodel.kernels.device.gate import DeviceGate
    from taxmodel.runtime.graph import GraphBackend
    from taxmodel.runtime.timing import CallTimer, max_over_ranks, repeat, side_stream_warm_up
    from taxmodel.workload import get_workload

    wname, vname, preset = case.split(":")
    wl = get_workload(wname)
    variant = wl.variants()[vname]
    ctx.barrier()
    ctx.heap.reset()
    state = wl.setup(ctx, wl.shape(preset), variant)
    step = functools.partial(variant.run, state)
    backend = GraphBackend(ctx.device)
    side_stream_warm_up(step, 3, backend=backend)
    ctx.barrier()
    g1 = backend.capture(step)
    gn = backend.capture(repeat(step, args.steps))
    g1.replay()
    gn.replay()
    torch.cuda.synchronize()
    gate = DeviceGate(ctx.heap, ctx.rank, ctx.world_size, ctx.device, args.spin_timeout,
                      hold_s=1500e-6 * (args.steps + 1) / 6)
    watch = CallTimer(ctx.device)

    def start() -> None:
        ctx.barrier()
        gate()

    def timed(graph: Any) -> float:
        start()
        return max_over_ranks(watch.elapsed_ms(graph.replay), ctx.device, ctx.group)

    def traced(activities: list[Any], body: Callable[[], None]) -> dict[str, Any]:
        with profile(activities=activities) as prof:
            start()
            body()
            torch.cuda.synchronize()
        return describe(split_steps(kernel_rows(prof), args.steps))

    def per_step() -> None:
        for _ in range(args.steps + 1):
            g1.replay()

    def one_graph() -> None:
        g1.replay()
        gn.replay()

    both = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    res: dict[str, Any] = dict(case=case, g1_ms=[], gn_ms=[], traced_per_step=[], traced_one_graph=[],
                               traced_cuda_only=[])
    for r in range(args.rounds):
        g1.replay()  # untimed: the first replay after a traced session ends is 90-150 us slow (2x H200)
        torch.cuda.synchronize()
        res["g1_ms"].append(timed(g1))
        res["gn_ms"].append(timed(gn))
        res["traced_per_step"].append(traced(both, per_step))
        res["traced_one_graph"].append(traced(both, one_graph))
        res["traced_cuda_only"].append(traced([ProfilerActivity.CUDA], per_step))
    gate.check()
    g1_med, gn_med = statistics.median(res["g1_ms"]), statistics.median(res["gn_ms"])
    res["unprofiled_step_us"] = (gn_med - g1_med) / (args.steps - 1) * 1e3
    summary = {}
    for key in ("traced_per_step", "traced_one_graph", "traced_cuda_only"):
        windows = [w for rec in res[key] for w in rec["windows_us"]]
        periods = [p for rec in res[key] for p in rec["periods_us"]]
        summary[key] = dict(window_us=statistics.mean(windows), period_us=statistics.mean(periods) if periods else None)
    res["summary_this_rank"] = summary
    log(f"{case}: un-profiled {res['unprofiled_step_us']:.1f} us; " + "; ".join(
        f"{k} window {v['window_us']:.1f} period {v['period_us'] or float('nan'):.1f}" for k, v in summary.items()))
    g1 = gn = state = None  # the graphs and buffers go before the next case allocates
    ctx.barrier()
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from taxmodel.runtime.heap import make_heap

    ctx = harness_init(args)
    ctx.heap = make_heap(ctx, 256 << 20)
    log = (lambda s: print(s, flush=True)) if ctx.rank == 0 else (lambda s: None)
    if not ctx.is_cuda:
        log("tracer_cost_graph: no GPU, nothing to trace (this run only checks that the script starts)")
        ctx.heap.close()
        dist.destroy_process_group() if dist.is_initialized() else None
        return 0
    cases = args.cases.split(",") if args.cases else list(GPU_CASES)
    results = []
    for case in cases:
        try:
            mine = run_case(ctx, case, args, log)
        except Exception as exc:  # noqa: BLE001 - one failing case is logged, the others still run
            mine = dict(case=case, error=f"{type(exc).__name__}: {exc}"[:400])
            print(f"rank {ctx.rank}: {case}: {mine['error']}", flush=True)
            torch.cuda.synchronize()
        every: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(every, mine)
        results.append(every)
    if ctx.rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = dict(device=torch.cuda.get_device_name(ctx.device), world_size=ctx.world_size, torch=torch.__version__,
                    steps=args.steps, rounds=args.rounds)
        (out / "tracer_cost.json").write_text(json.dumps(dict(meta=meta, cases=results), indent=1))
        log(f"wrote {out / 'tracer_cost.json'}")
    harness.close(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
