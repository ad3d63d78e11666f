"""In-kernel trace records on GPUs: what they cost, and whether they tell the truth.

GPU (4 ranks, a few minutes):
    OUT=out/bench_instrument torchrun --standalone --nproc-per-node 4 benchmarks/bench_instrument.py
    OUT=out/bench_instrument torchrun --standalone --nproc-per-node 4 benchmarks/bench_instrument.py \\
        --sizes b16-kv16k,b1-kv16k --ag-sizes m1024,m8192 --delay-us 500
CPU smoke test (2 ranks, Triton interpreter, tiny shapes; times mean nothing):
    TRITON_INTERPRET=1 torchrun --standalone --nproc-per-node 2 benchmarks/bench_instrument.py --cpu

Cases: the fused flash decode kernel (``--sizes``), and the fine-grained All-Gather+GEMM variants
with the ``sm`` transport (``--ag-variants`` push, pull at ``--ag-sizes``; their instrumented
kernels are ``ag_gemm_kernel`` and ``copy_blocks_kernel``). Each case runs twice in the same run,
plain (``INSTRUMENT=False``) and instrumented (records on), over the same inputs:
1. Overhead: ``--iters`` back-to-back eager iterations timed with CUDA events (max over ranks),
   plain and instrumented interleaved, ``--reps`` times; medians and their ratio (target: < 3 %).
   AG+GEMM also in CUDA graphs (``--iters`` iterations per graph, replays interleaved), because its
   eager time at small M is host-bound and would hide a GPU-side cost. (In a graph the record
   pointer is frozen; records have fixed slots per CTA (kernels/device/trace.py), so every replay
   rewrites the same slots with the full cost: clock reads, barriers, header loads and stores.)
2. Consistency: one instrumented iteration under torch.profiler; the records are drained,
   aligned to the trace's kernels (taxmodel.runtime.records.merge_records) and checked per
   instrumented kernel: each CTA's phases sum to its lifetime, every CTA lies inside its kernel,
   the records' span fits in the kernel's duration; the alignment residual is reported.
3. A late producer (flash decode; AG+GEMM push): iteration 0 as is, iteration 1 with rank 1
   sleeping ``--delay-us`` on the GPU before its kernels; the consumers' (ranks != 1) largest
   per-CTA flag_wait in iteration 1, minus iteration 0's, should be about the delay. For AG+GEMM
   this holds when the consumers' GEMMs need rank 1's rows from their start (their own slab fits
   in the first wave of tiles, e.g. M=1024 on 4 ranks); at larger M the own rows hide part of the
   delay, so the check is reported as not applicable there. (Pull has no late-producer case: it
   reads peers' slabs that are in place since setup.)

Order and bounds (why: one stuck phase must not cost the numbers of the others). Per case the
graph timing runs first, then the eager timing, then the traced steps (``--skip-trace`` drops
them). After each phase every rank reads its in-kernel error words: a wait that gave up (after
``--spin-timeout``; it ends that wait at once and every later wait of the state returns at once,
so a give-up costs one timeout, not one per launch) marks that phase failed, the error words are
cleared after a barrier, and the next phase still runs. ``--case-timeout`` arms a watchdog
(faulthandler, no GIL needed) that dumps every thread's stack and ends the process if a case
runs longer: a kernel that never returns cannot be cancelled from the host. Rank 0 writes the
results after every phase (a case still running is marked so), and ``--resume`` skips the cases
already in the results file, so a wrapper can start the script again after a watchdog exit:

    for i in 1 2 3; do timeout -k 5 60 torchrun ... bench_instrument.py --case-timeout 40 --resume && break; done
    python benchmarks/bench_instrument.py --summary --out DIR    # the table of what came out

Results: results.json and results.md under ``$OUT`` (or ``--out``); rank 0 prints the table. A
failing case is logged and skipped; the exit code is 1 if any case failed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_flash_decode import _ensure_taxmodel_kernels, init  # noqa: E402
from harness import all_max, rank_timer, recorded_batch  # noqa: E402

from taxmodel.runtime import timing  # noqa: E402
from taxmodel.runtime.timing import SLEEP_KERNEL_PATTERN  # noqa: E402

GPU_SIZES = ["b16-kv16k", "b1-kv16k", "b16-kv64k", "b16-kv1k"]
CPU_SIZES = ["tiny"]
AG_GPU_SIZES = ["m1024", "m8192"]
AG_CPU_SIZES = ["tiny"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--sizes", default=None, help="flash decode presets ('' for none)")
    p.add_argument("--ag-sizes", default=None, help="AG+GEMM presets ('' for none)")
    p.add_argument("--ag-variants", default="push,pull", help="AG+GEMM variants (sm transport)")
    p.add_argument("--ag-reserve-sms", action="store_true",
                   help="AG+GEMM: leave the copy kernel SMs of its own (GemmConfig.reserve_sms), so the persistent "
                        "GEMM can never occupy every SM while it waits for copies that have nowhere to run")
    p.add_argument("--iters", type=int, default=None, help="steps per timed batch")
    p.add_argument("--reps", type=int, default=None, help="timed batches per variant (median reported)")
    p.add_argument("--delay-us", type=float, default=200.0)
    p.add_argument("--spin-timeout", type=float, default=30.0)
    p.add_argument("--case-timeout", type=float, default=0.0,
                   help="seconds a case may take before the process dumps its stacks and exits (0: no limit)")
    p.add_argument("--resume", action="store_true", help="skip the cases already in the results file")
    p.add_argument("--skip-trace", action="store_true", help="timings only: no traced consistency/late-producer steps")
    p.add_argument("--summary", action="store_true", help="print the table of the results file in --out and exit")
    p.add_argument("--out", default=os.environ.get("OUT", "out/bench_instrument"))
    return p.parse_args(argv)


@dataclass(frozen=True)
class Case:
    """One instrumented variant at one size: which kernels carry records, and whether the
    late-producer check applies."""

    workload: str
    variant: str
    size: str
    kernels: tuple[str, ...]
    late_producer: bool
    graphs: bool  # also time the overhead in CUDA graphs

    @property
    def label(self) -> str:
        return f"{self.workload}/{self.variant}/{self.size}"


def flash_decode_cases(sizes: list[str]) -> list[Case]:
    from taxmodel.kernels.flash_decode import fused

    return [Case("flash_decode", "fused", s, (fused.KERNEL_NAME,), True, True) for s in sizes]


def ag_gemm_cases(sizes: list[str], variants: list[str]) -> list[Case]:
    from taxmodel.kernels.ag_gemm import pull, push

    kernels = {"push": (push.GEMM_KERNEL, push.PUSH_KERNEL), "pull": (pull.KERNEL, pull.STAGE_KERNEL)}
    return [Case("ag_gemm", v, s, kernels[v], v == "push", True) for s in sizes for v in variants]


def make_workload(case: Case, ctx: Any, reserve_sms: bool = False) -> Any:
    """The workload object of a case: AG+GEMM with the graph-safe, instrumented ``sm`` transport."""
    from taxmodel.workload import get_workload

    if case.workload == "ag_gemm":
        from taxmodel.kernels.ag_gemm.gemm_tiles import default_config
        from taxmodel.kernels.ag_gemm.workload import AgGemm

        return AgGemm(replace(default_config(ctx.device), transport="sm", reserve_sms=reserve_sms))
    return get_workload(case.workload)


def heap_bytes_needed(ag_sizes: list[str], variants: list[str], world: int, device: Any) -> int:
    """Heap for two AG+GEMM states at once (plain and instrumented), the largest size."""
    from taxmodel.kernels.ag_gemm.gemm_tiles import default_config
    from taxmodel.kernels.ag_gemm.state import pick_dtype
    from taxmodel.kernels.ag_gemm.workload import AgGemm, heap_bytes

    cfg = replace(default_config(device), transport="sm")
    dtype = pick_dtype({}, device)
    wl = AgGemm(cfg)
    need = [2 * heap_bytes(wl.shape(s), world, v, dtype, cfg) for s in ag_sizes for v in variants]
    return max(need, default=0)


# --- timing ----------------------------------------------------------------------------------


def _graph_overhead(ctx: Any, variant: Any, plain: Any, inst: Any, iters: int, reps: int) -> dict:
    """Plain and instrumented ``iters`` steps, each captured in one CUDA graph, replays interleaved
    (medians, ms per step); an empty dict on CPU or when a capture failed."""
    if not ctx.is_cuda:
        return {}
    timer = rank_timer(ctx, iters, 1)
    replays = {}
    for name, st in (("plain", plain), ("instrumented", inst)):
        times, replay, error = timer.graph(lambda st=st: variant.run(st))  # its one sample: a warm-up
        if times is None:
            return {"graph_error": error}
        replays[name] = replay
    times = timing.interleave({name: (lambda replay=replay: timer.sample(replay)) for name, replay in replays.items()},
                              reps)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"graph_plain_ms": med["plain"], "graph_instrumented_ms": med["instrumented"],
            "graph_overhead_pct": (med["instrumented"] / med["plain"] - 1.0) * 100.0}


# --- records under a trace ---------------------------------------------------------------------


def _traced_step(ctx: Any, variant: Any, state: Any, sleep_us: float = 0.0):
    """One instrumented step under torch.profiler: (kernel rows and aligned records of this rank,
    drained records, alignment info).

    The trace holds two steps: a warm-up step that absorbs the tracer's start-up (the first launch
    after the profiler starts can be delayed by tens of ms, differently on each rank), then the
    ranks meet (host barrier after a device sync) and the measured step runs, with rank-local
    ``sleep_us`` on the GPU first. Only the measured step's rows and records are returned."""
    from torch.profiler import record_function

    from taxmodel.runtime.records import merge_records
    from taxmodel.runtime.timing import gpu_sleep
    from taxmodel.trace.capture import TorchTracer, finish_events

    book = ctx.records
    book.arm(2)
    ctx.barrier()
    tracer = TorchTracer(ctx.device)
    with tracer:
        for step in (0, 1):
            ctx.synchronize()
            ctx.barrier()
            book.set_iteration(step)
            with record_function(f"ProfilerStep#{step}"):
                if sleep_us and step == 1:
                    gpu_sleep(sleep_us, ctx.device)
                variant.run(state)
                ctx.synchronize()
    raw = tracer.export()
    rec = book.drain(ctx.rank)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"rank{ctx.rank}.json.gz"
        path.write_bytes(raw)
        events, _ = TorchTracer.read([path])
    events = finish_events([events], variant.roles, emulated=not ctx.is_cuda)
    events = events[events["iteration"] == 1].assign(rank=ctx.rank)
    rec = rec[rec["iteration"] == 1].assign(rank=ctx.rank)
    merged, info = merge_records(events, rec)
    return merged, rec, info


def _consistency(merged, info, kernels: tuple[str, ...]) -> dict:
    """Per instrumented kernel: phases sum to each CTA's lifetime, CTAs inside the kernel."""
    out: dict[str, Any] = {"ok": True, "alignment_residual_ns": info["residual_ns"],
                           "spans_longer_than_kernel": info["spans_longer_than_kernel"], "kernels": {}}
    for name in kernels:
        kern = merged[(merged["kind"] == "kernel") & (merged["name"] == name)]
        rec = merged[(merged["kind"] == "record") & (merged["name"] == name)]
        if kern.empty and rec.empty:  # not launched in this step (the copy kernel on one rank: no peers)
            out["kernels"][name] = {"ok": True, "why": "not launched"}
            continue
        if kern.empty or rec.empty:
            out["kernels"][name] = {"ok": False, "why": f"{len(kern)} kernel rows, {len(rec)} aligned records"}
            out["ok"] = False
            continue
        ks, ke = int(kern["start_ns"].min()), int(kern["end_ns"].max())
        per_cta = rec.groupby("cta").agg(first=("start_ns", "min"), last=("end_ns", "max"))
        per_cta["sum"] = (rec["end_ns"] - rec["start_ns"]).groupby(rec["cta"]).sum()
        life = per_cta["last"] - per_cta["first"]
        ok = bool((per_cta["sum"] == life).all() and (per_cta["first"] >= ks).all() and (per_cta["last"] <= ke).all())
        out["kernels"][name] = {
            "ok": ok, "kernel_us": (ke - ks) / 1e3,
            "record_span_us": float((per_cta["last"].max() - per_cta["first"].min()) / 1e3),
            "ctas": int(len(per_cta)), "records": int(len(rec)),
            "max_phase_sum_minus_life_ns": int((per_cta["sum"] - life).abs().max()),
            "phases": {k: int(v) for k, v in rec["phase"].value_counts().items()},
        }
        out["ok"] = out["ok"] and ok
    out["ok"] = out["ok"] and info["spans_longer_than_kernel"] == 0
    return out


def _max_cta_wait_us(rec, kernel: str) -> float:
    w = rec[(rec["phase"] == "flag_wait") & (rec["name"] == kernel)]
    if w.empty:
        return 0.0
    return float((w["end_ns"] - w["start_ns"]).groupby(w["cta"]).sum().max() / 1e3)


def _own_rows_hide_delay(case: Case, state: Any) -> bool:
    """AG+GEMM: the consumers' GEMMs start on own tiles for more than one wave, which hides part
    of a producer's delay (the late-producer check then does not apply)."""
    if case.workload != "ag_gemm":
        return False
    from taxmodel.kernels.ag_gemm.gemm_tiles import num_programs, tile_counts

    bpr, n_tiles = tile_counts(state.m_loc, state.n_loc, state.world, state.cfg)
    progs = num_programs(state.cfg, state.c.device, state.world * bpr * n_tiles)
    return bpr * n_tiles > progs


# --- one case ----------------------------------------------------------------------------------


def _check_output(ctx: Any, wl: Any, shape: dict, st: Any, case: Case, which: str) -> None:
    """In-kernel errors and the output against the reference; raises on every rank if any rank is
    wrong (so no rank is left waiting in a collective)."""
    from taxmodel.errors import RunError
    from taxmodel.kernels.device.sync import check_errors

    problem = ""
    try:
        err = getattr(st, "err", None)
        if err is not None:
            check_errors(err, case.variant, ctx)
        ref = wl.reference(ctx, shape, st)
        if not bool(torch.allclose(wl.output(st).float(), ref, rtol=2e-2, atol=2e-2)):
            problem = "wrong output"
    except RunError as exc:
        problem = str(exc)
    if problem:
        print(f"rank {ctx.rank}: {case.label} ({which}): {problem}", flush=True)
    if all_max(ctx, 1.0 if problem else 0.0) > 0:
        raise RuntimeError(f"{case.label}: wrong output or in-kernel error on some rank ({which})")


def _progress(ctx: Any, case: Case, what: str) -> None:
    """A timestamped line from rank 0 (where a slow or stuck case spends its time)."""
    if ctx.rank == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {case.label}: {what}", flush=True)


def _phase_errors(ctx: Any, states: dict[str, Any], case: Case, phase: str) -> str:
    """After a phase: the in-kernel give-ups of every rank's states ("" when none anywhere). The
    error words are then cleared on every rank (after a barrier: no kernel of the phase still runs,
    and the device epochs counted every launch, so the next phase starts consistent)."""
    from taxmodel.errors import RunError
    from taxmodel.kernels.device.sync import check_errors

    ctx.synchronize()
    problem = ""
    for which, st in states.items():
        err = getattr(st, "err", None)
        if err is None:
            continue
        try:
            check_errors(err, case.variant, ctx)
        except RunError as exc:
            problem = problem or f"{which}: {exc}"
    if problem:
        print(f"rank {ctx.rank}: {case.label} ({phase}): {problem}", flush=True)
    bad = all_max(ctx, 1.0 if problem else 0.0) > 0
    if bad:
        ctx.barrier()
        for st in states.values():
            if getattr(st, "err", None) is not None:
                st.err.zero_()
        ctx.barrier()
    return (problem or "in-kernel wait gave up on another rank") if bad else ""


def _eager_overhead(ctx: Any, variant: Any, plain: Any, inst: Any, iters: int, reps: int) -> dict:
    """Back-to-back eager batches, plain and instrumented interleaved (medians, ms per step)."""
    timer = rank_timer(ctx, iters, 1)
    times = timing.interleave({"plain": lambda: recorded_batch(ctx, timer, variant, plain)[0],
                               "instrumented": lambda: recorded_batch(ctx, timer, variant, inst, ctx.records)[0]}, reps)
    med = {k: statistics.median(x) for k, x in times.items()}
    return {"plain_ms": med["plain"], "instrumented_ms": med["instrumented"],
            "overhead_pct": (med["instrumented"] / med["plain"] - 1.0) * 100.0,
            "plain_all_ms": times["plain"], "instrumented_all_ms": times["instrumented"]}


#: The timing columns of each phase, dropped when a wait of that phase gave up.
TIMING_KEYS = {"graph": ("graph_plain_ms", "graph_instrumented_ms", "graph_overhead_pct"),
               "eager": ("plain_ms", "instrumented_ms", "overhead_pct")}


def _timing_phase(ctx: Any, row: dict, states: Any, case: "Case", phase: str, timings: dict) -> None:
    """Add a timing phase's results to ``row``, unless one of its waits gave up on some rank: then
    the phase's error instead of numbers that include a timed-out wait."""
    row.update(timings)
    problem = _phase_errors(ctx, states, case, phase)
    if problem:
        row["phase_errors"][phase] = problem
        for key in TIMING_KEYS[phase]:
            row.pop(key, None)


def bench_case(ctx: Any, case: Case, args: argparse.Namespace,
               save: Callable[[dict], None] = lambda row: None) -> dict:
    """One case: setup and checks, graph timing, eager timing, traced steps (in this order, each
    phase's in-kernel errors checked and reported in the row). ``save`` gets the row after each
    phase (rank 0 writes it, so a later hang leaves the earlier numbers on disk)."""
    _progress(ctx, case, "setup")
    save({"case": case.label, "running": "setup and checks"})
    wl = make_workload(case, ctx, args.ag_reserve_sms)
    v = wl.variants()[case.variant]
    shape = wl.shape(case.size)
    ctx.heap.reset()
    ctx.instrument = False
    plain = wl.setup(ctx, shape, v)
    ctx.instrument = True
    inst = wl.setup(ctx, shape, v)
    ctx.instrument = False
    states = {"plain": plain, "instrumented": inst}
    for which, st in states.items():  # warm-up and correctness, both builds
        for _ in range(2):
            v.run(st)
        ctx.synchronize()
        _check_output(ctx, wl, shape, st, case, which)
    row: dict[str, Any] = {"case": case.label, "workload": case.workload, "variant": case.variant, "size": case.size,
                           "shape": shape, "phase_errors": {}, "running": "graph timing"}
    save(row)
    if case.graphs and ctx.is_cuda:
        _progress(ctx, case, "graph timing")
        _timing_phase(ctx, row, states, case, "graph", _graph_overhead(ctx, v, plain, inst, args.iters, args.reps))
        save({**row, "running": "eager timing"})
    _progress(ctx, case, "eager timing")
    _timing_phase(ctx, row, states, case, "eager", _eager_overhead(ctx, v, plain, inst, args.iters, args.reps))
    row.update(consistency=[], consistent=None, delay_us=args.delay_us, consumer_extra_wait_us=[], delay_seen=None,
               late_note="")
    if args.skip_trace:
        row.pop("running", None)
        return row
    save({**row, "running": "traced steps"})
    if ctx.is_cuda:  # calibrate the GPU sleep now, on every rank, not inside a traced step
        from taxmodel.runtime.timing import spin_cycles_per_us

        spin_cycles_per_us(ctx.device)
    _progress(ctx, case, "traced step")
    merged, _, info = _traced_step(ctx, v, inst)
    cons = _consistency(merged, info, case.kernels)
    conss = [None] * ctx.world_size
    dist.all_gather_object(conss, cons)
    row.update(consistency=conss, consistent=all(c["ok"] for c in conss))
    if case.late_producer and ctx.world_size < 2:
        row["late_note"] = "no late-producer check: it needs a producer rank 1 and a consumer (one rank ran)"
    elif case.late_producer:
        _progress(ctx, case, "late producer")
        # a late producer: rank 1 sleeps on its GPU before its kernels
        wait_kernel = case.kernels[0]
        m0, rec0, _ = _traced_step(ctx, v, inst)
        m1, rec1, _ = _traced_step(ctx, v, inst, sleep_us=args.delay_us if ctx.rank == 1 else 0.0)
        extra = _max_cta_wait_us(rec1, wait_kernel) - _max_cta_wait_us(rec0, wait_kernel)
        k0 = m0[(m0["kind"] == "kernel") & (m0["name"] == wait_kernel)]
        own_us = float((k0["end_ns"] - k0["start_ns"]).max() / 1e3) if len(k0) else 0.0
        # The delay the producer really had: its sleep kernel in the trace (torch.cuda._sleep
        # spins a cycle count calibrated at one clock; the SM clock can differ in the step).
        sleeps = m1[(m1["kind"] == "kernel") & m1["name"].str.contains(SLEEP_KERNEL_PATTERN, regex=True)]
        slept_us = float((sleeps["end_ns"] - sleeps["start_ns"]).sum() / 1e3) if len(sleeps) else 0.0
        def first_start(m: Any, name: str) -> float:
            k = m[(m["kind"] == "kernel") & (m["name"] == name)]
            return float(k["start_ns"].min()) if len(k) else float("nan")

        # (wait kernel, producing kernel) starts per step: the producer's rows leave in its last
        # listed kernel (AG+GEMM push: the copy kernel on its side stream; flash decode: the kernel)
        starts = tuple((first_start(m, wait_kernel), first_start(m, case.kernels[-1])) for m in (m0, m1))
        # how long the producing kernel ran in the plain step: its rows arrive by its end
        p0 = m0[(m0["kind"] == "kernel") & (m0["name"] == case.kernels[-1])]
        produce_us = float((p0["end_ns"] - p0["start_ns"]).max() / 1e3) if len(p0) else 0.0
        triples = [None] * ctx.world_size
        dist.all_gather_object(triples, (extra, own_us, slept_us, starts, produce_us))
        pairs = [(e, k) for e, k, _, _, _ in triples]
        produce = triples[1][4]  # the producer's producing kernel
        slept = triples[1][2] if triples[1][2] > 0 else args.delay_us
        row["producer_sleep_us"] = slept
        # How much later the producer's kernel started than each consumer's (one host: the ranks'
        # traces share its clock), in each step; a consumer waits only for a producer that starts
        # after it, so the extra wait the delay should cause is max(0, lag in the delayed step)
        # - max(0, lag in the plain step): the sleep, plus or minus how the ranks left the barrier.
        lags = {r: tuple((triples[1][3][i][1] - t[3][i][0]) / 1e3 for i in (0, 1))
                for r, t in enumerate(triples) if r != 1}
        row["producer_start_lags_us"] = [lags[r] for r in sorted(lags)]
        lag = {r: max(0.0, d1) - max(0.0, d0) for r, (d0, d1) in lags.items()}
        row["producer_start_lag_us"] = [lag[r] for r in sorted(lag)]
        consumers = [e for r, (e, _) in enumerate(pairs) if r != 1]
        row["consumer_extra_wait_us"] = consumers
        row["consumer_step0_kernel_us"] = [k for r, (_, k) in enumerate(pairs) if r != 1]
        floors = [lag[r] - k - 20.0 for r, (_, k) in enumerate(pairs) if r != 1]
        if _own_rows_hide_delay(case, inst):
            row["late_note"] = "n/a: own rows cover more than a wave and hide part of the delay"
        elif any(f <= 0.0 for f in floors):
            # The window below would start at or under zero: any extra wait, none included, would
            # pass. Not a check; say so instead of reporting "seen".
            row["late_note"] = (f"inconclusive: a consumer's undelayed kernel "
                                f"({max(k for r, (_, k) in enumerate(pairs) if r != 1):.0f} us) is not shorter than "
                                f"the delay; raise --delay-us")
        else:
            # A consumer keeps working on its own share while the producer is late, so its extra
            # wait lies between the expected lag minus its own undelayed kernel time and the lag
            # plus the producing kernel's own time (its rows arrive by its end), with 20 us for
            # launch and clock jitter either way.
            row["delay_seen"] = bool(consumers) and all(
                lag[r] - k - 20.0 <= e <= lag[r] + produce + 20.0 for r, (e, k) in enumerate(pairs) if r != 1)
    problem = _phase_errors(ctx, states, case, "trace")
    if problem:
        row["phase_errors"]["trace"] = problem
    row.pop("running", None)
    plain = inst = states = None
    ctx.barrier()
    return row


# --- output ------------------------------------------------------------------------------------


def _fmt(v: Any, spec: str = ".4f", suffix: str = "") -> str:
    return "" if v is None or v != v else f"{v:{spec}}{suffix}"


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# In-kernel records: overhead and consistency ({meta['device']}, {meta['world_size']} ranks)", "",
             f"eager: {meta['iters']} back-to-back iterations, CUDA events, max over ranks, median of {meta['reps']} "
             "interleaved batches; graph: the same iterations in one CUDA graph"
             + ("; AG+GEMM with SMs reserved for the copy kernel" if meta.get("ag_reserve_sms") else "") + ".", "",
             "| case | plain ms | instrumented ms | overhead | graph plain ms | graph instr. ms | graph overhead | "
             "phases = lifetime, inside kernel | delay asked (slept) | consumers' extra flag_wait / expected from start lags (us) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | FAILED: {r['error'][:120]} |||||||||")
            continue
        lags = r.get("producer_start_lag_us") or [None] * len(r.get("consumer_extra_wait_us", []))
        late = ", ".join(f"{e:.1f}" + (f" / {g:.1f}" if g is not None else "")
                         for e, g in zip(r.get("consumer_extra_wait_us", []), lags)) or "-"
        if r.get("late_note"):
            late += f" ({r['late_note']})"
        elif r.get("delay_seen") is not None:
            late += " (seen)" if r["delay_seen"] else " (NOT seen)"
        consistent = {None: "not run", True: "yes", False: "NO"}[r.get("consistent")]
        graph = _fmt(r.get("graph_plain_ms")) or ("capture failed" if r.get("graph_error") else "")
        if "graph" in r.get("phase_errors", {}):
            graph = "wait gave up"
        eager = _fmt(r.get("plain_ms")) or ("wait gave up" if "eager" in r.get("phase_errors", {}) else "")
        if r.get("running"):  # the process ended (watchdog, time limit) inside this phase
            late += f" (stopped during {r['running']})"
        lines.append(f"| {r['case']} | {eager} | {_fmt(r.get('instrumented_ms'))} | "
                     f"{_fmt(r.get('overhead_pct'), '+.2f', ' %')} | {graph} | "
                     f"{_fmt(r.get('graph_instrumented_ms'))} | "
                     f"{_fmt(r.get('graph_overhead_pct'), '+.2f', ' %')} | {consistent} | "
                     f"{_fmt(r.get('delay_us'), '.0f', ' us')}"
                     + (f" ({r['producer_sleep_us']:.0f} us)" if r.get("producer_sleep_us") else "") + f" | {late} |")
        notes += [f"- {r['case']} ({phase}): {text[:300]}" for phase, text in r.get("phase_errors", {}).items()]
    if notes:
        lines += ["", "In-kernel give-ups (that phase's numbers are left out):", *notes]
    return "\n".join(lines) + "\n"


def write_results(rows: list[dict], meta: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str) + "\n")
    (out / "results.md").write_text(markdown(rows, meta))


def _resize_heap(ctx: Any, nbytes: int) -> None:
    """Replace the context's heap by a larger one when the AG+GEMM cases need it (collective)."""
    from taxmodel.runtime.heap import make_heap

    if nbytes > ctx.heap.nbytes:
        ctx.heap.close()
        ctx.heap = make_heap(ctx, nbytes + (1 << 20))


def _summary_line(row: dict, delay_us: float) -> str:
    """One progress line per finished case (rank 0)."""
    graph = (f", graph {row['graph_plain_ms']:.4f} -> {row['graph_instrumented_ms']:.4f} ms "
             f"({row['graph_overhead_pct']:+.2f} %)" if "graph_plain_ms" in row else "")
    errors = f", gave up in {sorted(row['phase_errors'])}" if row.get("phase_errors") else ""
    nan = float("nan")
    return (f"{row['case']}: plain {row.get('plain_ms', nan):.4f} ms, instrumented "
            f"{row.get('instrumented_ms', nan):.4f} ms ({row.get('overhead_pct', nan):+.2f} %){graph}{errors}, "
            f"consistent={row['consistent']}, extra flag_wait on "
            f"consumers {[round(e, 1) for e in row['consumer_extra_wait_us']]} us for a {delay_us} us delay "
            f"{row['late_note']}")


def _read_results(out: Path) -> tuple[list[dict], dict]:
    path = out / "results.json"
    if not path.exists():
        return [], {}
    data = json.loads(path.read_text())
    return list(data.get("rows", [])), dict(data.get("meta", {}))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summary:  # no GPU, no process group: the table of what a (possibly interrupted) run wrote
        rows, meta = _read_results(Path(args.out))
        if not rows:
            print(f"no results under {args.out}")
            return 1
        print(markdown(rows, meta))
        return 0 if all("error" not in r and not r.get("running") and not r.get("phase_errors") for r in rows) else 1
    import faulthandler

    dump_after = float(os.environ.get("TAXMODEL_DUMP_STACKS_AFTER_S", "0") or 0)
    if dump_after > 0:  # where a stuck run is stuck: every thread's stack, to stderr
        faulthandler.dump_traceback_later(dump_after, repeat=False)
    _ensure_taxmodel_kernels()
    ctx = init(args)
    args.iters = args.iters or (2 if args.cpu else 50)
    args.reps = args.reps or (2 if args.cpu else 15)

    def pick(value: str | None, cpu: list[str], gpu: list[str]) -> list[str]:
        if value is None:
            return cpu if args.cpu else gpu
        return [s for s in value.split(",") if s]

    fd_sizes = pick(args.sizes, CPU_SIZES, GPU_SIZES)
    ag_sizes = pick(args.ag_sizes, AG_CPU_SIZES, AG_GPU_SIZES)
    ag_variants = [v for v in args.ag_variants.split(",") if v]
    cases = flash_decode_cases(fd_sizes) + ag_gemm_cases(ag_sizes, ag_variants)
    out = Path(args.out)
    found = [_read_results(out)[0] if args.resume and ctx.rank == 0 else []]
    if dist.is_initialized():  # rank 0's view for everyone: every rank must run the same cases
        dist.broadcast_object_list(found, src=0)
    rows: list[dict] = found[0]
    done = {r["case"] for r in rows}
    cases = [c for c in cases if c.label not in done]
    _resize_heap(ctx, heap_bytes_needed(ag_sizes, ag_variants, ctx.world_size, ctx.device))
    log: Callable[[str], None] = (lambda s: print(s, flush=True)) if ctx.rank == 0 else (lambda s: None)
    if done:
        log(f"resuming: {len(done)} case(s) already in {out / 'results.json'}, {len(cases)} to run")
    failures = 0
    meta = {"device": torch.cuda.get_device_name() if ctx.is_cuda else "cpu (interpreter)",
            "world_size": ctx.world_size, "iters": args.iters, "reps": args.reps, "torch": torch.__version__,
            "ag_reserve_sms": bool(args.ag_reserve_sms), "spin_timeout_s": args.spin_timeout,
            "case_timeout_s": args.case_timeout}

    def save(partial: dict) -> None:  # rank 0: the finished rows and the running case's numbers so far
        if ctx.rank == 0:
            write_results(rows + [partial], meta, out)

    for case in cases:
        stop = False
        if args.case_timeout > 0:  # a kernel that never returns cannot be cancelled: end the process
            faulthandler.dump_traceback_later(args.case_timeout, repeat=False, exit=True)
        try:
            row = bench_case(ctx, case, args, save)
        except Exception as exc:  # one failing case must not hide the others
            failures += 1
            print(f"rank {ctx.rank}: {case.label}: FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}",
                  flush=True)
            row = {"case": case.label, "error": f"{type(exc).__name__}: {exc}"}
            stop = ctx.is_cuda and case.workload == "ag_gemm"  # peers may be left spinning: stop cleanly
        else:
            failures += bool(row.get("phase_errors"))
            log(_summary_line(row, args.delay_us))
        if args.case_timeout > 0:
            faulthandler.cancel_dump_traceback_later()
        rows.append(row)
        if ctx.rank == 0:  # what is done so far survives a later hang or time limit
            write_results(rows, meta, out)
        if stop:
            break
    if ctx.rank == 0:
        print(markdown(rows, meta))
    ctx.heap.close()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
