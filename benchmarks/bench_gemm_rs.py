"""GEMM + Reduce-Scatter benchmark: correctness of every variant at every size, then timings side by side.

GPU (4 ranks, under 4 minutes; taxmodel installed with its kernels, Iris importable):
    OUT=out/bench_gemm_rs torchrun --nproc-per-node 4 benchmarks/bench_gemm_rs.py
CPU smoke test (2 ranks, gloo, Triton interpreter, tiny shape; times say nothing about GPUs):
    TRITON_INTERPRET=1 torchrun --nproc-per-node 2 benchmarks/bench_gemm_rs.py --cpu

Per size (the workload's presets: M in 1024, 4096, 8192 at N = K = 8192 and at N = K = 4096; each
rank holds A_r [M, K/world] and B_r [K/world, N] and keeps M/world rows of the sum):
1. Correctness: every variant (and every fused config) runs once with its output poisoned (NaN)
   and is compared with the fp32 reference (the sum of every rank's shard product, rebuilt from
   seeds); a wrong variant is reported and not timed.
2. Timing: bsp (cuBLAS + NCCL reduce_scatter_tensor), torch_fused
   (torch.ops.symm_mem.fused_matmul_reduce_scatter) and fused (a few tile configs x the two
   reduction placements, the best reported, every one listed as fused@tune); floors: the
   partial-product GEMM alone (cuBLAS, and the fused GEMM kernel storing locally with nothing to
   send), reduce_scatter alone. A time is the mean per iteration of a batch of back-to-back
   iterations started after a barrier (after warm-up runs that also compile every kernel), the
   maximum over ranks (the slowest rank sets the pace), median over ``--reps`` batches.
   With ``--graph``, every graph-safe variant and config (bsp, fused) also as iterations captured
   in one CUDA graph and replayed, checked on fresh inputs after the replays (bench_ag_gemm's timer
   and check; ``<variant>@graph`` rows), and the floors replayed the same way (``floor:...@graph``).
   On CPU the "graph" runs eagerly (a smoke test of the flow).
3. ``--records``: the best fused config once more, plain and with in-kernel records (a second
   state compiled with ``INSTRUMENT=True``; per-iteration record buffers armed before each batch,
   as ``taxmodel profile --instrument`` does, and drained after it), batches interleaved
   (plain, records, plain, ...), ``--reps`` each; rows ``fused(plain)`` and ``fused(records)``
   with the median overhead, plus a check that the instrumented output is right and that every
   iteration wrote the expected number of well-formed records (none dropped).
The final round (``--final-rounds``, bench_ag_gemm's ``final_round``): every variant at its best
config and every floor side by side, timed in rounds that take turns (rows ``<name>@final``); the
verdict columns compare those only (the rows above run one after another, on a GPU whose clock may
fall under a long load).
Results: results.json, results.csv and results.md under ``$OUT`` (or ``--out``); rank 0 prints the table.
Exit code 1 if any variant was wrong or a size failed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Rank setup, cross-rank timing and the poisoned correctness check are the All-Gather+GEMM
# benchmark's (generic over workloads): reused, not copied.
from bench_ag_gemm import (add_final_rounds, add_shape_option, check, check_after_replays, check_final_rounds,  # noqa: E402
                           final_round, floor_in_graph, read_shape_overrides, record_floor, results_frames,
                           run_sizes, speed_cell, time_batches, time_graph)
from harness import all_max, init, rank_timer, recorded_batch  # noqa: E402

from taxmodel.runtime import timing  # noqa: E402
from taxmodel.runtime.heap import make_heap  # noqa: E402

GPU_SIZES = ["m1024", "m4096", "m8192", "m1024_n4096", "m4096_n4096", "m8192_n4096"]
CPU_SIZES = ["tiny"]

#: GEMM tile sets (128x256x64 with 8 warps was the best Triton GEMM on H200 for ag_gemm; the
#: 128x128 tiles give twice the tiles, for the small per-rank GEMMs).
TILES = {
    "256s3": dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=8),
    "256s4": dict(block_m=128, block_n=256, block_k=64, num_stages=4, num_warps=8, group_m=8),
    "128s4": dict(block_m=128, block_n=128, block_k=64, num_stages=4, num_warps=4, group_m=8),
    "256s3g1": dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, group_m=1),  # no L2 grouping
}
#: Reduction placements; a token may add the tile order: "kernel-first" (every peer's tile first, own
#: tiles last), "kernel-l2" (spread, own blocks 2 rounds behind); plain "kernel" is the default order.
REDUCES = ("kernel", "tail")
TUNE_SETS = {"quick": (["256s3", "128s4"], list(REDUCES)), "explore": (list(TILES), list(REDUCES))}


def reduce_fields(token: str) -> dict[str, Any]:
    """A tune-set reduction token -> RsConfig fields: "kernel", "tail", "kernel-first" (spread=False),
    "tail-l2" (the spread order with lag 2)."""
    name, *opts = token.split("-")
    if name not in REDUCES:
        raise SystemExit(f"unknown reduction {token!r}: use one of {list(REDUCES)} (with -first or -l<N>)")
    fields: dict[str, Any] = {"reduce": name}
    for opt in opts:
        if opt == "first":
            fields["spread"] = False
        elif opt[:1] == "l" and opt[1:].isdigit():
            fields["lag"] = int(opt[1:])
        else:
            raise SystemExit(f"bad reduction option {opt!r} in {token!r} (-first, or -l<N> for the lag)")
    return fields


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="CPU smoke test (gloo, Triton interpreter, tiny shape)")
    p.add_argument("--sizes", default=None, help="comma-separated presets (default: all issue sizes)")
    add_shape_option(p, "e.g. --shape N=16384 (a wider output: more N-tiles per M-block)")
    p.add_argument("--variants", default="bsp,torch_fused,fused")
    p.add_argument("--iters", type=int, default=None, help="iterations per timed batch")
    p.add_argument("--reps", type=int, default=None, help="timed batches (median reported)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--no-tune", action="store_true", help="time the default fused config only")
    p.add_argument("--tune-set", default="quick",
                   help=f"one of {sorted(TUNE_SETS)} or 'TILES:REDUCES' (comma-separated keys of {sorted(TILES)} "
                        f"and {list(REDUCES)}, each optionally with -first (every peer's tile first) or -l<N> (the "
                        "spread order's lag), e.g. 256s3:kernel,kernel-first)")
    p.add_argument("--graph", action="store_true",
                   help="also time every graph-safe variant and config (bsp, fused) as iterations captured in one CUDA "
                        "graph and replayed, checked on fresh inputs after the replays (as bench_ag_gemm --graph)")
    add_final_rounds(p)
    p.add_argument("--final-every-config", action="store_true",
                   help="besides the best fused config, every correct fused config tried joins the final round "
                        "(rows fused[<config>]@final): alternatives compared side by side")
    p.add_argument("--records", action="store_true",
                   help="also time the best fused config plain vs with in-kernel records (interleaved batches)")
    p.add_argument("--spin-timeout", type=float, default=30.0)
    p.add_argument("--out", default=os.environ.get("OUT", "out/bench_gemm_rs"))
    args = p.parse_args(argv)
    check_final_rounds(p, args)
    read_shape_overrides(p, args)
    return args


def fused_configs(args: argparse.Namespace, device: torch.device) -> list[Any]:
    from taxmodel.kernels.gemm_rs.state import GPU_RS_CONFIG, default_rs_config

    if args.cpu:
        base = default_rs_config(device)
        return [base, replace(base, reduce="tail"), replace(base, spread=False)]
    if args.no_tune:
        return [GPU_RS_CONFIG]
    if ":" in args.tune_set:
        t, r = args.tune_set.split(":")
        tiles, reduces = t.split(","), r.split(",")
    else:
        tiles, reduces = TUNE_SETS[args.tune_set]
    return [replace(GPU_RS_CONFIG, gemm=replace(GPU_RS_CONFIG.gemm, **TILES[t]), **reduce_fields(r))
            for t in tiles for r in reduces]


def bench_size(ctx: Any, args: argparse.Namespace, preset: str, heap: Any, log: Callable[[str], None]) -> list[dict]:
    from taxmodel.kernels.device.epochs import new_epoch_slots
    from taxmodel.kernels.gemm_rs.tiles import launch_gemm_rs
    from taxmodel.kernels.gemm_rs.workload import GemmRs

    wl = GemmRs()
    shape = wl.shape(preset, seed=1, **args.shape_overrides)
    big = shape["M"] * shape["N"] * shape["K"] >= 8192 ** 3 // 2
    iters = args.iters or (2 if args.cpu else (10 if big else 20))
    reps = args.reps or (1 if args.cpu else 5)
    warmup = args.warmup if args.warmup is not None else (1 if args.cpu else 3)
    variants = wl.variants()
    configs = fused_configs(args, ctx.device)
    rows: list[dict] = []
    ref = ref2 = None
    timer = rank_timer(ctx, iters, reps) if args.graph else None
    chosen: dict[str, tuple[Any, str]] = {}

    def record(name: str, ms: float, cfg: str = "", ok: bool | None = None, err: float | None = None,
               note: str = "") -> None:
        cost = wl.cost(shape, ctx.world_size, name if name in variants else "bsp")
        tflops = cost.flops / (ms * 1e-3) / 1e12 if ms == ms and ms > 0 else float("nan")
        rows.append(dict(size=preset, M=shape["M"], N=shape["N"], K=shape["K"], world=ctx.world_size, variant=name,
                         ms=round(ms, 5) if ms == ms else None, tflops_per_rank=round(tflops, 2), config=cfg,
                         correct=ok, max_abs_err=err, note=note))
        mark = "" if ok is None else ("ok" if ok else "WRONG")
        log(f"  {preset:12s} {name:24s} {ms:9.4f} ms  {tflops:7.1f} TF/s/rank  {mark} {cfg} {note}")

    def fresh_state(variant: Any, cfg: Any = None) -> Any:
        heap.reset()
        ctx.heap = heap
        wl.config = cfg
        return wl.setup(ctx, shape, variant)

    for vname in args.variants.split(","):
        variant = variants[vname]
        why = variant.available(ctx)
        if why:
            rows.append(dict(size=preset, variant=vname, ms=None, note=f"unavailable: {why}"))
            log(f"  {preset:12s} {vname:24s} unavailable: {why}")
            continue
        best = best_graph = None
        best_cfg = None
        tried_ok = []  # the fused configs that were correct (--final-every-config)
        for cfg in (configs if vname == "fused" else [None]):
            st = fresh_state(variant, cfg)
            if ref is None:
                ref = wl.reference(ctx, shape, st)
            ok, err = check(ctx, wl, shape, st, variant, ref)
            label = cfg.label() if cfg is not None else ""
            note = st.cache.get("warmup_error", "")
            ms = time_batches(ctx, lambda: variant.run(st), iters, reps, warmup) if ok else float("nan")
            if ok and (best is None or ms < best[0]):
                best, best_cfg = (ms, label, err), cfg
            if ok and cfg is not None:
                tried_ok.append(cfg)
            if timer is not None and ok and variant.graph_safe:
                gms, gok, gnote = time_graph(ctx, st, variant, timer)
                if gok:
                    ref2 = ref2 if ref2 is not None else wl.reference(ctx, {**shape, "seed": 2}, st)
                    gok, gerr = check_after_replays(ctx, wl, st, variant, ref2)
                    gnote = gnote if gok else "WRONG after a graph replay with fresh inputs"
                    if gok and (best_graph is None or gms < best_graph[0]):
                        best_graph = (gms, label, gerr)
                log(f"  {preset:12s} {vname + '@graph(config)':24s} {gms:9.4f} ms  {'ok' if gok else gnote} {label}")
            if vname == "fused" and len(configs) > 1:
                rows.append(dict(size=preset, variant="fused@tune", ms=ms, config=label, correct=ok, max_abs_err=err,
                                 note=note))
                log(f"  {preset:12s} {'fused@tune':24s} {ms:9.4f} ms  {'ok' if ok else 'WRONG'} {label} {note}")
            if not ok:
                log(f"  {preset:12s} {vname:24s} WRONG (max abs err {err:.3g}) {label}")
            st = None  # free before the next config allocates
        if best is not None:
            record(vname, best[0], best[1], True, best[2])
        else:
            record(vname, float("nan"), "", False, None, "no config was correct")
        if best is not None:  # the final interleaved round times every variant at its best config
            chosen[vname] = (best_cfg, best_graph[1] if best_graph is not None else best[1])
            if args.final_every_config:
                for cfg in tried_ok:
                    if cfg.label() != chosen[vname][1]:
                        chosen[f"{vname}[{cfg.label()}]"] = (cfg, cfg.label())
        if best_graph is not None:
            record(f"{vname}@graph", best_graph[0], best_graph[1], True, best_graph[2])
        elif timer is not None and variant.graph_safe:
            record(f"{vname}@graph", float("nan"), "", False, None, "no config was right after graph replays")
        if vname == "fused" and args.records and best_cfg is not None:
            rows.extend(records_overhead(ctx, wl, shape, preset, variant, best_cfg, ref, heap, iters, reps, warmup,
                                         log))

    # Floors: the partial-product GEMM alone (cuBLAS; the fused GEMM kernel with every tile kept
    # local, nothing sent or waited on) and the reduce-scatter alone.
    st = fresh_state(variants["bsp"])
    record_floor(record, ctx, timer, "floor:matmul(cublas)", lambda: torch.matmul(st.a, st.b, out=st.partial), iters,
                 reps, warmup)
    scratch = torch.empty(2, 1, st.m, st.n, dtype=st.dtype, device=ctx.device)  # both epoch halves, one rank
    flags = torch.zeros(triton_tiles(st.m, st.n, configs), dtype=torch.int32, device=ctx.device)
    bases = torch.zeros(1, dtype=torch.int64, device=ctx.device)  # one rank: pointers translate to themselves
    best_triton = None
    for cfg in unique_gemms(configs):
        # Epoch slots per configuration: every launch on one buffer needs the same grid.
        def triton_gemm(cfg=cfg, epochs=new_epoch_slots(ctx.device)) -> None:
            launch_gemm_rs(st.a, st.b, scratch, st.out, flags, bases, st.err, rank=0, world=1, m_loc=st.m,
                           epochs=epochs, budget=st.budget, sync=st.sync, cfg=cfg.gemm, tail=False,
                           rows=cfg.reduce_rows)
        ms = time_batches(ctx, triton_gemm, iters, reps, warmup)
        log(f"  {preset:12s} {'gemm(triton)@tune':24s} {ms:9.4f} ms  {cfg.label()}")
        if best_triton is None or ms < best_triton[0]:
            best_triton = (ms, cfg.label(), triton_gemm)
    record("floor:gemm(triton)", best_triton[0], best_triton[1])
    if timer is not None:
        gms, note = floor_in_graph(timer, best_triton[2])
        record("floor:gemm(triton)@graph", gms, best_triton[1], note=note)
    floors = {"floor:matmul(cublas)": lambda: torch.matmul(st.a, st.b, out=st.partial),
              "floor:gemm(triton)": best_triton[2]}
    if ctx.world_size > 1:
        floors["floor:reduce_scatter"] = lambda: dist.reduce_scatter_tensor(st.out, st.partial, group=ctx.group)
        record_floor(record, ctx, timer, "floor:reduce_scatter", floors["floor:reduce_scatter"], iters, reps, warmup)
    if args.final_rounds > 0 and chosen:
        final_round(ctx, args, wl, shape, chosen, floors, heap, iters, ref, record, log)
    st = floors = None
    return rows


def records_overhead(ctx: Any, wl: Any, shape: dict, preset: str, variant: Any, cfg: Any, ref: torch.Tensor,
                     heap: Any, iters: int, reps: int, warmup: int, log: Callable[[str], None]) -> list[dict]:
    """Fused ``cfg`` plain and with in-kernel records: interleaved batches, medians (ms per iteration,
    max over ranks), the instrumented output checked, and the records of every timed iteration
    counted and checked for form (chained, none dropped)."""
    from taxmodel.kernels.gemm_rs.tiles import records_per_iteration

    heap.reset()
    ctx.heap = heap
    wl.config = cfg
    plain = wl.setup(ctx, shape, variant)
    ctx.instrument = True
    try:
        inst = wl.setup(ctx, shape, variant)  # record buffers: ctx.records (taxmodel.runtime.records)
    finally:
        ctx.instrument = False
    book = ctx.records
    ok, err = check(ctx, wl, shape, inst, variant, ref)
    expect = records_per_iteration(inst.m_loc, inst.n, ctx.world_size, cfg.gemm)

    timer = rank_timer(ctx, iters, 1)
    bad: list[str] = []

    def batch(instrumented: bool) -> float:
        ms, rec = recorded_batch(ctx, timer, variant, inst if instrumented else plain, book if instrumented else None)
        if rec is not None:
            bad.extend(records_problems(rec, expect, iters))
        return ms

    timing.warm_up([lambda: variant.run(plain), lambda: variant.run(inst)], warmup)
    times = timing.interleave({False: lambda: batch(False), True: lambda: batch(True)}, reps)
    if book.dropped:
        bad.append(f"dropped for capacity: {book.dropped}")
    bad_all = all_max(ctx, float(len(bad)))
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = (med[True] / med[False] - 1) * 100
    note = (f"records overhead {overhead:+.1f}% (median of {reps} interleaved batches); {expect} records per iteration "
            + ("well formed" if not bad_all else f"PROBLEMS on some rank: {'; '.join(bad[:3]) or 'see other ranks'}"))
    log(f"  {preset:12s} {'fused(plain)':24s} {med[False]:9.4f} ms  {cfg.label()}")
    log(f"  {preset:12s} {'fused(records)':24s} {med[True]:9.4f} ms  {'ok' if ok else 'WRONG'} {note}")
    return [dict(size=preset, variant="fused(plain)", ms=round(med[False], 5), config=cfg.label(), correct=None,
                 note=""),
            dict(size=preset, variant="fused(records)", ms=round(med[True], 5), config=cfg.label(), correct=ok,
                 max_abs_err=err, overhead_pct=round(overhead, 2), records_ok=not bad_all, note=note)]


def records_problems(rec: Any, expect: int, iters: int) -> list[str]:
    """What is wrong with one batch's drained records: each iteration must hold ``expect`` records,
    none ending before it starts, and each CTA's records of a kernel must not overlap."""
    out = []
    counts = rec.groupby("iteration").size()
    if len(counts) != iters or (counts != expect).any():
        out.append(f"records per iteration {sorted(set(counts.tolist()))}, expected {expect} in each of {iters}")
    if (rec["end_ns"] < rec["start_ns"]).any():
        out.append("records ending before they start")
    srt = rec.sort_values(["iteration", "name", "cta", "start_ns"], kind="stable")
    keys = srt[["iteration", "name", "cta"]].to_numpy()
    same = (keys[1:] == keys[:-1]).all(axis=1)  # consecutive records of one CTA of one kernel launch
    if (srt["start_ns"].to_numpy()[1:][same] < srt["end_ns"].to_numpy()[:-1][same]).any():
        out.append("overlapping records within a CTA")
    return out


def triton_tiles(m: int, n: int, configs: list[Any]) -> int:
    """Flags the one-rank GEMM floor needs (the most over the configs' tile sizes)."""
    from taxmodel.kernels.gemm_rs.tiles import own_tiles

    return max(own_tiles(m, n, c.gemm) for c in configs)


def unique_gemms(configs: list[Any]) -> list[Any]:
    """One config per distinct set of GEMM parameters (the reduction placement does not matter alone)."""
    seen, out = set(), []
    for c in configs:
        if c.gemm not in seen:
            seen.add(c.gemm)
            out.append(c)
    return out


def write_results(rows: list[dict], out: Path, meta: dict) -> None:
    df, table = results_frames(rows, out, meta)
    lines = ["# GEMM + Reduce-Scatter (ms per iteration, max over ranks, median of batches)", "",
             f"world size {meta['world_size']}, device {meta['device']}, torch {meta['torch']}, "
             f"triton {meta['triton']}, {meta['seconds']} s", ""]
    cols = list(table.columns)
    graphs = any(str(c).endswith("@graph") for c in cols)
    final = any(str(c).endswith("@final") for c in cols)
    extra = ["fused vs bsp"] + (["graph: fused vs bsp"] if graphs else []) \
        + (["final: fused vs bsp", "final: fused vs torch_fused", "final: fused vs cuBLAS alone"] if final else [])
    lines.append("| size | " + " | ".join(cols + extra) + " |")
    lines.append("|---" * (len(cols) + len(extra) + 1) + "|")
    for size, r in table.iterrows():
        speeds = [speed_cell(r, ("fused",), "bsp")] + ([speed_cell(r, ("fused@graph",), "bsp@graph")] if graphs else [])
        if final:
            speeds += [speed_cell(r, ("fused@final",), base)
                       for base in ("bsp@final", "torch_fused@final", "floor:matmul(cublas)@final")]
        cells = ["" if v is None or v != v else f"{v:.4f}" for v in (r[c] for c in cols)]
        lines.append(f"| {size} | " + " | ".join(cells + speeds) + " |")
    if graphs:
        lines += ["", "`@graph`: iterations captured in one CUDA graph and replayed (graph-safe variants: bsp and "
                  "fused; torch_fused is eager only), each config checked on fresh inputs after the replays."]
    if final:
        lines += ["", "`@final`: every variant at its best config and every floor set up side by side and timed in "
                  "rounds that take turns (graph replays where graph-safe, else eager batches), the median of the "
                  "rounds: the only columns that saw the same GPU state, so the only ones to compare across."]
    best = df[df["variant"] == "fused"][["size", "config"]] if "config" in df else df.iloc[:0]
    if len(best):
        lines += ["", "Best fused config per size: " + "; ".join(f"{s}: {c}" for s, c in best.itertuples(index=False))]
    notes = df[df["note"].astype(str).str.len() > 0][["size", "variant", "note"]] if "note" in df else df.iloc[:0]
    if len(notes):
        lines += ["", "Notes:"] + [f"- {s} {v}: {n}" for s, v, n in notes.drop_duplicates().itertuples(index=False)]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = init(args)
    from taxmodel.kernels.gemm_rs.state import heap_bytes, pick_dtype
    from taxmodel.kernels.gemm_rs.workload import GemmRs

    sizes = args.sizes.split(",") if args.sizes else (CPU_SIZES if args.cpu else GPU_SIZES)
    wl = GemmRs()
    dtype = pick_dtype({}, ctx.device)
    configs = fused_configs(args, ctx.device)
    need = max(heap_bytes(wl.shape(s, **args.shape_overrides), ctx.world_size, "fused", dtype, c)
               for s in sizes for c in configs)
    need *= 2 if args.records else 1  # --records: a plain and an instrumented fused state at once
    need *= len(configs) if args.final_every_config and not args.cpu else 1  # every config's state in the final round
    heap = make_heap(ctx, need + (1 << 20))
    log = (lambda s: print(s, flush=True)) if ctx.rank == 0 else (lambda s: None)
    log(f"gemm_rs benchmark: world {ctx.world_size}, {ctx.device}, sizes {sizes}, heap {need / 2**20:.0f} MiB, "
        f"{len(configs)} fused config(s)")
    return run_sizes(ctx, args, sizes, heap, bench_size, write_results, log)


if __name__ == "__main__":
    sys.exit(main())
