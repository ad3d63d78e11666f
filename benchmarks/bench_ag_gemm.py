"""All-Gather + GEMM benchmark: correctness of every variant at every size, then timings side by side.

GPU (4 ranks):
    OUT=out/bench torchrun --nproc-per-node 4 benchmarks/bench_ag_gemm.py
    OUT=out/bench torchrun --nproc-per-node 4 benchmarks/bench_ag_gemm.py --graph --sizes m1024,m8192 \
        --variants bsp,pull,push --tune-set s3,n128s4:sm64,ce-mem
CPU smoke test (2 ranks, Triton interpreter, tiny shapes):
    TRITON_INTERPRET=1 torchrun --nproc-per-node 2 benchmarks/bench_ag_gemm.py --cpu [--graph]

Per size it (1) checks every variant (and every tuned config) against an fp32 reference with C
poisoned with NaN before the run, (2) times bsp, torch_fused, pull and push (push and pull over a
small set of configs, the best reported), plus the floors: cuBLAS matmul alone, the Triton GEMM alone
(same kernel, all rows local) and all_gather alone. A time is the mean per iteration of a batch of
back-to-back iterations started after a barrier, the maximum over ranks (the slowest rank sets the
pace), median over ``--reps`` batches. (3) The final round (``--final-rounds``, ``final_round``):
every variant at its best config and every floor set up side by side and timed in rounds that take
turns, the rows ``<name>@final``: the steps above run one variant after another, and a GPU that
slows down under a long load (the H200 after ~50 ms of GEMMs) makes their times depend on their
order, so only the ``@final`` columns are compared across variants in the verdict columns.
Results go to ``$OUT`` (or ``--out``): results.json, results.csv, results.md. Rank 0 prints the
table. ``--shape K=V`` overrides a shape value of every size (``--shape N=4096`` on 2 ranks: the
4-rank tensor-parallel weight shard).

``--graph`` also times, for every variant and config that is graph-safe (``Variant.graph_safe``:
bsp, pull with any transport, push with the ``sm`` one; not push on the copy engines), ``--iters``
iterations captured in one CUDA graph and replayed (``harness.rank_timer``, as bench_flash_decode: max
over ranks, median over ``--reps`` replays), beside the eager time of the same config, and the
floors too (``floor:...@graph``: the GEMM or the collective alone, replayed the same way, so that a
graph variant is compared with a floor timed as it is). After the
replays every rank refills its inputs in place with a new seed, poisons C, replays the graph once
more and checks C against the new reference. Graph rows are ``<variant>@graph``; with several
transports tried, the best per transport is also a ``<variant>[<transport>]`` row. On CPU there
are no graphs: the "graph" path runs eagerly (a smoke test of the flow only).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from taxmodel.runtime.context import RankContext
from taxmodel.workload import tolerance_of
from taxmodel.runtime.heap import make_heap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import all_max, init, rank_timer  # noqa: E402

from taxmodel.runtime import timing  # noqa: E402

GPU_SIZES = ["m1024", "m4096", "m8192", "m16384", "m1024_n4096", "m8192_n4096", "m1024_tp", "m8192_tp"]
CPU_SIZES = ["tiny", "tiny_tp"]


#: GEMM tile sets per tuning set (128x256x64, 8 warps was the best Triton GEMM on H200 so far).
TILES = {
    "s3": dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8),
    "s4": dict(block_m=128, block_n=256, block_k=64, num_stages=4, num_warps=8),
    "s3st": dict(block_m=128, block_n=256, block_k=64, num_stages=3, num_warps=8, tma_store=True),
    "s4st": dict(block_m=128, block_n=256, block_k=64, num_stages=4, num_warps=8, tma_store=True),
    # Groups of 5 M-blocks: at M=1024 on 4 ranks (2 blocks per slab) the first group is own rows plus
    # every peer's first block, so the first wave never waits on a second block.
    # 128x128 tiles: at M=1024 on 4 ranks the own slab is one wave of tiles (128 of 132 SMs), so
    # the communication has a whole wave to land before any tile needs a remote block.
    "n128s4": dict(block_m=128, block_n=128, block_k=64, num_stages=4, num_warps=8),
    "n128s4st": dict(block_m=128, block_n=128, block_k=64, num_stages=4, num_warps=8, tma_store=True),
    "s4st-g5": dict(block_m=128, block_n=256, block_k=64, num_stages=4, num_warps=8, tma_store=True, group_m=5),
}
#: Transports per tuning set (see GemmConfig): copy engines with either flag signal, the Triton copy
#: kernel co-resident with the GEMM or on reserved SMs, and the direct pull (reference only).
TRANSPORTS = {
    "ce-mem": dict(transport="ce", ce_signal="mem"),
    "ce-kernel": dict(transport="ce", ce_signal="kernel"),
    # Several M-blocks per copy-engine copy (about this many bytes each), one flag per copy.
    **{f"ce-mem-{mib}m": dict(transport="ce", ce_signal="mem", ce_copy_bytes=mib << 20) for mib in (4, 8, 16, 32, 64)},
    "ce-mem-1b": dict(transport="ce", ce_signal="mem", ce_copy_bytes=0),  # one block per copy (before 2026-11-28)
    # Pull's order fixed (GemmConfig.ce_order; "ce-mem" picks by shape): one stream per peer, copy by
    # copy, or peer by peer on one stream (default copy sizes or 16/32/64 MiB).
    "ce-mem-round": dict(transport="ce", ce_signal="mem", ce_order="round"),
    "ce-mem-step": dict(transport="ce", ce_signal="mem", ce_order="step"),
    **{f"ce-mem-{mib}m-step": dict(transport="ce", ce_signal="mem", ce_copy_bytes=mib << 20, ce_order="step")
       for mib in (16, 32, 64)},
    "sm32": dict(transport="sm", push_progs=32),
    "sm16r": dict(transport="sm", push_progs=16, reserve_sms=True),
    "sm64f": dict(transport="sm", push_progs=64, push_chunk_k=512),
    "sm64": dict(transport="sm", push_progs=64, push_chunk_k=1024),
    "direct": dict(transport="direct"),
}
TUNE_SETS = {
    "quick": (["s3", "s4st", "n128s4"], ["ce-mem", "sm32"]),  # the winners of the H200 runs
    "small": (["s3", "s4st", "s4st-g5"], ["ce-mem", "sm32", "sm64f"]),
    "explore": (["s3", "s4", "s3st", "s4st"], ["ce-mem", "ce-kernel", "sm32", "sm16r"]),
}


def gpu_configs(preset: str, tune_set: str = "quick") -> list[Any]:
    """The per-size tuning set: GEMM tiles x transports (GEMM tiles alone for the floor)."""
    from taxmodel.kernels.ag_gemm.gemm_tiles import GPU_CONFIG

    if ":" in tune_set:  # "tiles:transports", each comma-separated keys of TILES / TRANSPORTS
        t, tr = tune_set.split(":")
        tiles, transports = t.split(","), tr.split(",")
    else:
        tiles, transports = TUNE_SETS[tune_set]
    return [replace(GPU_CONFIG, **TILES[t], **TRANSPORTS[tr]) for t in tiles for tr in transports]


def configs_for(variant: str, configs: list[Any]) -> list[Any]:
    """Push has no direct transport; the others besides pull/push need one config only."""
    if variant == "push":
        return [c for c in configs if c.transport != "direct"]
    if variant == "pull":
        return configs
    return configs[:1]


def gemm_only(configs: list[Any]) -> list[Any]:
    """The configs that differ in GEMM parameters (transport settings ignored)."""
    seen, out = set(), []
    for c in configs:
        key = (c.block_m, c.block_n, c.block_k, c.group_m, c.num_stages, c.num_warps, c.use_tma, c.tma_store,
               c.epi_split)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="CPU smoke test (gloo, Triton interpreter, tiny shapes)")
    p.add_argument("--sizes", default=None, help="comma-separated presets (default: all issue sizes)")
    add_shape_option(p, "e.g. --shape N=4096: on 2 ranks the tensor-parallel presets then have the 4-rank presets' "
                        "weight shard [K, 2048]")
    p.add_argument("--variants", default="bsp,torch_fused,pull,push")
    p.add_argument("--iters", type=int, default=None, help="iterations per timed batch")
    p.add_argument("--reps", type=int, default=None, help="timed batches (median reported)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--no-tune", action="store_true",
                   help="time each variant's default only: the config the workload picks for the shape (the "
                        "per-shape tile table; pull's first-wave tiles)")
    p.add_argument("--tune-set", default="quick",
                   help=f"tuning set: one of {sorted(TUNE_SETS)} or 'TILES:TRANSPORTS' (comma-separated keys of "
                        f"{sorted(TILES)} and {sorted(TRANSPORTS)})")
    p.add_argument("--graph", action="store_true", help="also time CUDA-graph replays of the graph-safe variants")
    add_final_rounds(p)
    p.add_argument("--final-every-config", action="store_true",
                   help="besides each variant's best config, every correct config of pull and push tried joins the "
                        "final round (rows pull[<config>]@final): alternatives compared side by side")
    p.add_argument("--spin-timeout", type=float, default=30.0)
    p.add_argument("--out", default=os.environ.get("OUT", "out/bench_ag_gemm"))
    args = p.parse_args(argv)
    check_final_rounds(p, args)
    read_shape_overrides(p, args)
    return args


def add_shape_option(p: argparse.ArgumentParser, example: str) -> None:
    """The ``--shape K=V`` option (``read_shape_overrides``), for this benchmark and bench_gemm_rs.py."""
    p.add_argument("--shape", action="append", default=[], metavar="K=V",
                   help=f"override one shape value of every size (repeatable), {example}")


def read_shape_overrides(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``args.shape_overrides``: the ``--shape`` values as a dict of integers (a malformed one is a usage error)."""
    args.shape_overrides = {}
    for item in args.shape:
        key, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            p.error(f"--shape {item!r}: expected KEY=INTEGER, e.g. N=4096")
        args.shape_overrides[key.strip()] = int(value)


def add_final_rounds(p: argparse.ArgumentParser) -> None:
    """The ``--final-rounds`` option (``final_round``), for this benchmark and bench_gemm_rs.py."""
    p.add_argument("--final-rounds", type=int, default=None,
                   help="rounds of the final comparison: every variant at its best config and every floor side by "
                        "side, taking turns (rows <name>@final; the verdict columns use them); default 7 on a GPU, "
                        "1 with --cpu, 0 to skip")


def check_final_rounds(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--final-rounds``' default (7 on a GPU, 1 with --cpu) and its range."""
    if args.final_rounds is None:
        args.final_rounds = 1 if args.cpu else 7
    if args.final_rounds < 0:
        p.error("--final-rounds must be 0 or more")


def time_batches(ctx: RankContext, fn: Callable[[], Any], iters: int, reps: int, warmup: int) -> float:
    """Median over ``reps`` of (max over ranks of the per-iteration time of a batch), in ms."""
    timing.warm_up(fn, warmup)
    ctx.barrier()
    return statistics.median(rank_timer(ctx, iters, reps).samples_of(timing.repeat(fn, iters)))


def host_ms(ctx: RankContext, fn: Callable[[], Any], iters: int) -> float:
    """Host time per iteration of enqueueing ``fn`` (max over ranks): when it reaches the GPU time,
    the variant is launch-bound, not GPU-bound."""
    ctx.synchronize()
    ms = timing.time_ms(timing.repeat(fn, iters), "cpu", iters)  # the host clock: enqueueing, not running
    ctx.synchronize()
    return all_max(ctx, ms)


def check(ctx: RankContext, wl: Any, shape: dict, st: Any, variant: Any, ref: torch.Tensor,
          run: Callable[[], Any] | None = None) -> tuple[bool, float]:
    """Poison C, run once (``run``, default one iteration of the variant), check in-kernel errors and
    compare with the reference (on every rank)."""
    from taxmodel.errors import RunError
    from taxmodel.kernels.device.sync import check_errors

    st.poison()
    try:  # every rank reaches the collectives below, even when its kernel gave up waiting
        (run or (lambda: variant.run(st)))()
        ctx.synchronize()
        check_errors(st.err, variant.name, ctx)
    except RunError as exc:
        print(f"rank {ctx.rank}: {exc}", flush=True)
        all_max(ctx, 1.0)
        all_max(ctx, float("inf"))
        return False, float("inf")
    out = wl.output(st).float()
    rtol, atol = tolerance_of(wl, shape, ctx.world_size)  # a sum over ranks in 16 bits grows with them
    err = float((out - ref).abs().max().item()) if out.numel() else 0.0
    ok = bool(torch.allclose(out, ref, rtol=rtol, atol=atol)) and not math.isnan(err)
    ok_all = all_max(ctx, 0.0 if ok else 1.0) == 0.0
    return ok_all, all_max(ctx, err if not math.isnan(err) else float("inf"))


def time_graph(ctx: RankContext, st: Any, variant: Any, timer: timing.SampleTimer) -> tuple[float, bool | None, str]:
    """(median ms per iteration of graph replays, whether they left no in-kernel error on any rank
    (None when capture failed), note). Keeps the replay in ``st.cache`` for ``check_after_replays``."""
    from taxmodel.errors import RunError
    from taxmodel.kernels.device.sync import check_errors

    times, replay, error = timer.graph(lambda: variant.run(st))
    if times is None:
        return float("nan"), None, f"graph capture failed: {error}"
    st.cache["graph_replay"] = replay
    ctx.synchronize()
    try:
        check_errors(st.err, variant.name, ctx)
        bad = 0.0
    except RunError as exc:
        print(f"rank {ctx.rank}: {exc}", flush=True)
        bad = 1.0
    ok = all_max(ctx, bad) == 0.0
    return statistics.median(times), ok, "" if ok else "in-kernel wait gave up during graph replays"


def floor_in_graph(timer: timing.SampleTimer, fn: Callable[[], Any]) -> tuple[float, str]:
    """A floor (a GEMM or a collective alone) timed as the ``@graph`` variants are: ``fn`` captured
    ``iters`` times in one CUDA graph, the median of the replays' per-iteration times (max over
    ranks); (nan, why) when the capture failed. On CPU the timer runs ``fn`` eagerly."""
    times, _, error = timer.graph(fn)
    if times is None:
        return float("nan"), f"graph capture failed: {error}"
    return statistics.median(times), ""


def record_floor(record: Callable[..., None], ctx: RankContext, timer: timing.SampleTimer | None, name: str, fn: Callable[[], Any],
                 iters: int, reps: int, warmup: int, cfg: str = "") -> None:
    """Floor ``name`` (``fn`` alone) timed in eager batches, and with a graph ``timer`` (``--graph``)
    also replayed in a CUDA graph as ``name@graph``, through the benchmark's ``record``."""
    record(name, time_batches(ctx, fn, iters, reps, warmup), cfg)
    if timer is not None:
        gms, note = floor_in_graph(timer, fn)
        record(f"{name}@graph", gms, cfg, note=note)


def check_after_replays(ctx: RankContext, wl: Any, st: Any, variant: Any, ref: torch.Tensor) -> tuple[bool, float]:
    """Fresh inputs written in place (seed 2; the graph reads the same buffers), C poisoned, the
    captured graph replayed once, C checked against ``ref`` (the reference of seed 2)."""
    ctx.barrier()  # nobody still reads the old shards
    st.reseed(2)  # must match the seed of ``ref``
    ctx.barrier()  # every shard refreshed before any rank's replay reads its peers'
    shape = dict(st.shape)
    return check(ctx, wl, shape, st, variant, ref, run=st.cache.pop("graph_replay"))


def bench_size(ctx: RankContext, args: argparse.Namespace, preset: str, heap: Any, log: Callable[[str], None]) -> list[dict]:
    from taxmodel.kernels.ag_gemm import gemm_tiles
    from taxmodel.kernels.ag_gemm.workload import AgGemm

    wl = AgGemm()
    shape = wl.shape(preset, seed=1, **args.shape_overrides)
    iters = args.iters or (2 if args.cpu else (10 if shape["M"] >= 8192 else 20))
    reps = args.reps or (1 if args.cpu else 3)
    warmup = args.warmup if args.warmup is not None else (1 if args.cpu else 3)
    rows: list[dict] = []
    variants = wl.variants()
    tune = not args.cpu and not args.no_tune
    # each variant's config when none is given (a fresh workload: ``wl.config`` is set below)
    shipped = {v: AgGemm().shape_config(shape, ctx.world_size, v, ctx.device) for v in variants}
    if tune:
        configs = gpu_configs(preset, args.tune_set)
    elif args.cpu:  # both transports: the smoke test covers the eager-only and the graph-safe paths
        configs = [replace(gemm_tiles.CPU_CONFIG, transport=t) for t in ("ce", "sm")]
    else:  # what the workload runs when no config is given: per shape (table; pull's first-wave tiles)
        configs = list(dict.fromkeys(shipped.values()))
    ref = None

    def record(name: str, ms: float, cfg: str = "", ok: bool | None = None, err: float | None = None, note: str = "") -> None:
        cost = wl.cost(shape, ctx.world_size, name if name in variants else "bsp")
        tflops = cost.flops / (ms * 1e-3) / 1e12 if ms > 0 else float("nan")
        rows.append(dict(size=preset, M=shape["M"], N=shape["N"], K=shape["K"], tp=shape.get("tp", 0), world=ctx.world_size,
                         variant=name, ms=round(ms, 5), tflops_per_rank=round(tflops, 2), config=cfg, correct=ok,
                         max_abs_err=err, note=note))
        log(f"  {preset:14s} {name:22s} {ms:9.4f} ms  {tflops:7.1f} TF/s/rank  {'' if ok is None else ('ok' if ok else 'WRONG')} {cfg}")

    timer = rank_timer(ctx, iters, reps) if args.graph else None
    ref2 = None  # the reference of the fresh inputs used after graph replays
    chosen: dict[str, tuple[Any, str]] = {}  # variant -> (its best config, label): the final round times these
    for vname in args.variants.split(","):
        variant = variants[vname]
        why = variant.available(ctx)
        if why:
            rows.append(dict(size=preset, variant=vname, ms=None, note=f"unavailable: {why}"))
            log(f"  {preset:14s} {vname:22s} unavailable: {why}")
            continue
        best: dict[str, tuple] = {}  # "eager", "graph", "eager:<transport>" -> (ms, label, err)
        tuned = configs_for(vname, configs)
        if not tune and not args.cpu:  # each variant's own default (push keeps the table's tiles)
            tuned = [shipped[vname]]
        tried_ok = []  # the configs that were correct (--final-every-config)
        for cfg in tuned:
            heap.reset()
            ctx.heap = heap
            wl.config = cfg
            graph_safe = wl.variants()[vname].graph_safe  # depends on the config's transport
            st = wl.setup(ctx, shape, variant)
            if ref is None:
                ref = wl.reference(ctx, shape, st)
            ok, err = check(ctx, wl, shape, st, variant, ref)
            ms = time_batches(ctx, lambda: variant.run(st), iters, reps, warmup) if ok else float("nan")
            hms = host_ms(ctx, lambda: variant.run(st), iters) if ok else float("nan")
            label = cfg.label() if vname in ("push", "pull") else ""
            if ok:
                tried_ok.append(cfg)
                for key in ("eager", f"eager:{cfg.transport}"):
                    if key not in best or ms < best[key][0]:
                        best[key] = (ms, label, err, cfg)
            gms, gnote = float("nan"), ""
            if timer is not None and ok and not graph_safe:
                gnote = "eager only (not graph-safe)"
            elif timer is not None and ok:
                gms, gok, gnote = time_graph(ctx, st, variant, timer)
                if gok:
                    if ref2 is None:
                        ref2 = wl.reference(ctx, {**shape, "seed": 2}, st)
                    gok, gerr = check_after_replays(ctx, wl, st, variant, ref2)
                    if gok and ("graph" not in best or gms < best["graph"][0]):
                        best["graph"] = (gms, label, gerr, cfg)
                    if not gok:
                        gnote = "WRONG after a graph replay with fresh inputs"
                if gok is False:
                    rows.append(dict(size=preset, variant=f"{vname}@graph", ms=None, config=label, correct=False,
                                     note=gnote))
                    log(f"  {preset:14s} {vname + '@graph':22s} {gnote} {label}")
                gms = gms if gok else float("nan")
            if vname in ("push", "pull") and (tune or timer is not None):
                rows.append(dict(size=preset, variant=f"{vname}@tune", ms=ms, host_ms=round(hms, 5),
                                 graph_ms=None if gms != gms else round(gms, 5), config=label, correct=ok,
                                 max_abs_err=err, note=gnote))
                gtxt = f"graph {gms:.4f} ms" if gms == gms else gnote
                log(f"  {preset:14s} {vname + '@tune':22s} {ms:9.4f} ms  (host {hms:.4f} ms; {gtxt})  {label}")
            if not ok:
                log(f"  {preset:14s} {vname:22s} WRONG (max abs err {err:.3g}) {label}")
            st = None  # free before the next config allocates
        if "eager" in best:
            record(vname, best["eager"][0], best["eager"][1], True, best["eager"][2])
        else:
            record(vname, float("nan"), "", False, None, "no config was correct")
        transports = sorted(k.split(":", 1)[1] for k in best if k.startswith("eager:"))
        if len(transports) > 1:
            for tr in transports:
                b = best[f"eager:{tr}"]
                record(f"{vname}[{tr}]", b[0], b[1], True, b[2])
        if "graph" in best:
            record(f"{vname}@graph", best["graph"][0], best["graph"][1], True, best["graph"][2])
        if "graph" in best or "eager" in best:  # the final interleaved round: graph replays where it can
            pick = best["graph"] if "graph" in best else best["eager"]
            chosen[vname] = (pick[3], pick[1])
            if args.final_every_config and vname in ("pull", "push"):
                for cfg in tried_ok:
                    if cfg.label() != pick[1]:
                        chosen[f"{vname}[{cfg.label()}]"] = (cfg, cfg.label())
    # Floors: the GEMM alone (cuBLAS, and our Triton kernel with every row local) and the all-gather alone.
    heap.reset()
    ctx.heap = heap
    wl.config = configs[0]
    st = wl.setup(ctx, shape, variants["bsp"])
    from taxmodel.kernels.ag_gemm.state import make_shard

    gathered = torch.cat([make_shard(1, r, st.m_loc, st.k, st.dtype, ctx.device) for r in range(ctx.world_size)])
    record_floor(record, ctx, timer, "floor:matmul(cublas)", lambda: torch.matmul(gathered, st.b, out=st.c), iters,
                 reps, warmup)
    best_triton = None
    for cfg in gemm_only(configs):
        descs = {}
        if cfg.use_tma and gemm_tiles.tma_available():  # (cfg carries tma_store)
            descs = dict(a_desc=gemm_tiles.make_descriptor(gathered, [cfg.block_m, cfg.block_k]),
                         b_desc=gemm_tiles.make_descriptor(st.b, [cfg.block_k, cfg.block_n]))

        def triton_gemm(cfg=cfg, descs=descs) -> None:
            gemm_tiles.launch_ag_gemm(gathered, st.b, st.c, mode=gemm_tiles.A_LOCAL, rank=ctx.rank, world=ctx.world_size,
                                      m_loc=st.m_loc, cfg=cfg, err=st.err, sync=st.sync, **descs)
        ms = time_batches(ctx, triton_gemm, iters, reps, warmup)
        log(f"  {preset:14s} {'gemm(triton)@tune':22s} {ms:9.4f} ms  {cfg.label()}")
        if best_triton is None or ms < best_triton[0]:
            best_triton = (ms, cfg.label(), triton_gemm)
    record("floor:gemm(triton)", best_triton[0], best_triton[1])
    if timer is not None:
        gms, note = floor_in_graph(timer, best_triton[2])
        record("floor:gemm(triton)@graph", gms, best_triton[1], note=note)
    floors = {"floor:matmul(cublas)": lambda: torch.matmul(gathered, st.b, out=st.c),
              "floor:gemm(triton)": best_triton[2]}
    if ctx.world_size > 1 and ctx.backend != "threads":
        out = torch.empty(st.m, st.k, dtype=st.dtype, device=ctx.device)
        floors["floor:all_gather"] = lambda: dist.all_gather_into_tensor(out, st.a_local, group=ctx.group)
        record_floor(record, ctx, timer, "floor:all_gather", floors["floor:all_gather"], iters, reps, warmup)
    if args.final_rounds > 0 and chosen:
        final_round(ctx, args, wl, shape, chosen, floors, heap, iters, ref, record, log)
    st = floors = None
    return rows


def final_round(ctx: RankContext, args: argparse.Namespace, wl: Any, shape: dict, chosen: dict[str, tuple[Any, str]],
                floors: dict[str, Callable[[], Any]], heap: Any, iters: int, ref: torch.Tensor,
                record: Callable[..., None], log: Callable[[str], None]) -> None:
    """Every variant at its best config and every floor, set up side by side and timed in
    ``--final-rounds`` rounds that take turns (the first one rotating), so that all of them see the
    same GPU state: the H200 slows its GEMMs down after ~50 ms of continuous load, and the rounds
    above run one variant after another. A graph-safe variant (and every floor) is timed as
    ``--iters`` steps captured in one CUDA graph, the others as eager batches; rows
    ``<name>@final`` (ms per step, max over ranks, median of the rounds). Each variant is checked
    against the reference first. ``chosen``: row name (a variant, or ``variant[config]`` for an
    alternative config) -> (its config, the label to show); the heap must hold every chosen
    state at once. bench_gemm_rs.py runs it too."""
    samplers: dict[str, Callable[[], float]] = {}
    samplers_meta: dict[str, str] = {}
    one = rank_timer(ctx, iters, 1)
    heap.reset()
    ctx.heap = heap
    states = []
    for vname, (cfg, label) in chosen.items():
        wl.config = cfg
        variant = wl.variants()[vname.split("[", 1)[0]]
        st = wl.setup(ctx, shape, variant)  # every rank in the same order: symmetric allocations
        states.append(st)
        ok, _ = check(ctx, wl, shape, st, variant, ref)
        if not ok:
            log(f"  {vname}@final: WRONG at the final setup; left out")
            continue
        def step(variant: Any = variant, st: Any = st) -> None:
            variant.run(st)

        kind = "graph" if args.graph and variant.graph_safe else "eager"
        if kind == "graph":
            _, replay, error = one.graph(step)
            if error:
                log(f"  {vname}@final: graph capture failed ({error}); eager batches instead")
                kind = "eager"
        if kind == "eager":
            timing.warm_up(step, 2)
            replay = timing.repeat(step, iters)
        samplers[f"{vname}@final"] = (lambda replay=replay: one.sample(replay))
        samplers_meta[f"{vname}@final"] = f"{kind} {label}".strip()
    for name, fn in floors.items():
        _, replay, error = one.graph(fn) if args.graph else (None, timing.repeat(fn, iters), "")
        if error:
            continue
        samplers[f"{name}@final"] = (lambda replay=replay: one.sample(replay))
        samplers_meta[f"{name}@final"] = "graph" if args.graph else "eager"
    times = timing.interleave(samplers, args.final_rounds, rotate=True, discard=1)
    for name, values in times.items():
        lo, hi = timing.decile_range(values)
        record(name, statistics.median(values), samplers_meta[name],
               note=f"median of {len(values)} interleaved rounds ({samplers_meta[name]}); p10-p90 {lo:.4f}-{hi:.4f} ms")
    states.clear()
    heap.reset()


def results_frames(rows: list[dict], out: Path, meta: dict) -> tuple[Any, Any]:
    """Write results.json and results.csv under ``out``; return (all rows, ms per size x variant
    without the tuning rows) as DataFrames, for the Markdown table each benchmark writes."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    df = pd.DataFrame(rows)
    for col in ("size", "variant", "ms"):
        if col not in df.columns:
            df[col] = None
    df.to_csv(out / "results.csv", index=False)
    main = df[~df["variant"].astype(str).str.endswith("@tune")]
    return df, main.pivot_table(index="size", columns="variant", values="ms", aggfunc="first", sort=False)


def write_results(rows: list[dict], out: Path, meta: dict) -> None:
    _, table = results_frames(rows, out, meta)
    lines = ["# All-Gather + GEMM (ms per iteration, max over ranks, median of batches)", "",
             f"world size {meta['world_size']}, device {meta['device']}, torch {meta['torch']}, triton {meta['triton']}", ""]
    cols = list(table.columns)
    graphs = any(str(c).endswith("@graph") for c in cols)
    final = any(str(c).endswith("@final") for c in cols)
    extra = ["best fine-grained vs bsp"] + (["graph: best fine-grained vs bsp"] if graphs else []) \
        + (["final: best fine-grained vs bsp", "final: best fine-grained vs torch_fused"] if final else [])
    lines.append("| size | " + " | ".join(cols + extra) + " |")
    lines.append("|---" * (len(cols) + len(extra) + 1) + "|")
    for size, r in table.iterrows():
        speeds = [speed_cell(r, ("pull", "push"), "bsp")]
        if graphs:
            speeds.append(speed_cell(r, ("pull@graph", "push@graph"), "bsp@graph"))
        if final:
            speeds += [speed_cell(r, ("pull@final", "push@final"), base) for base in ("bsp@final", "torch_fused@final")]
        cells = ["" if v != v else f"{v:.4f}" for v in (r[c] for c in cols)]
        lines.append(f"| {size} | " + " | ".join(cells + speeds) + " |")
    if graphs:
        lines += ["", "`@graph`: --iters iterations captured in one CUDA graph and replayed (graph-safe configs only: "
                  "push on the copy engines is eager only); `[ce]`/`[sm]`: best eager config per transport."]
    if final:
        lines += ["", "`@final`: every variant at its best config and every floor set up side by side and timed in "
                  "rounds that take turns (graph replays where graph-safe, else eager batches), the median of the "
                  "rounds: the only columns that saw the same GPU state, so the only ones to compare across."]
    (out / "results.md").write_text("\n".join(lines) + "\n")


def speed_cell(r: Any, fine: tuple[str, ...], base: str) -> str:
    """How much faster the best of the ``fine`` columns is than ``base`` (bsp time / best time - 1)."""
    fg = [r[c] for c in fine if c in r and r[c] == r[c]]
    if not fg or base not in r or r[base] != r[base]:
        return ""
    best = min(fg)
    return f"{(r[base] / best - 1) * 100:+.1f}% faster" if best < r[base] else f"{(best / r[base] - 1) * 100:.1f}% slower"


def run_sizes(ctx: RankContext, args: argparse.Namespace, sizes: list[str], heap: Any,
              bench_size: Callable[..., list[dict]], write_results: Callable[[list[dict], Path, dict], None],
              log: Callable[[str], None]) -> int:
    """Benchmark every size (one failing size does not hide the others), write the results on
    rank 0, tear down; return the exit code (1 if anything failed or was wrong). Shared by the
    workload benchmarks."""
    import traceback

    import triton  # after init(): TRITON_INTERPRET must be set before triton is imported

    t0 = time.time()
    rows: list[dict] = []
    failures = 0

    def meta() -> dict:
        return dict(world_size=ctx.world_size, device=torch.cuda.get_device_name() if ctx.is_cuda else "cpu",
                    torch=torch.__version__, triton=triton.__version__, seconds=round(time.time() - t0, 1),
                    args=vars(args))

    for preset in sizes:
        stop = False
        try:
            size_rows = bench_size(ctx, args, preset, heap, log)
        except Exception as exc:  # one size failing (a hang turned error) must not hide the others
            log(f"  {preset}: FAILED: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            size_rows = [dict(size=preset, variant="error", note=f"{type(exc).__name__}: {exc}")]
            failures += 1
            stop = ctx.is_cuda  # a failed fine-grained kernel can leave peers spinning; stop cleanly
        rows.extend(size_rows)
        failures += sum(1 for r in size_rows if r.get("correct") is False)
        log(f"  ({time.time() - t0:.0f} s so far)")
        if ctx.rank == 0:  # what is done so far survives a later hang or time limit
            write_results(rows, Path(args.out), meta())
        if stop:
            break
    if ctx.rank == 0:
        write_results(rows, Path(args.out), meta())
        print((Path(args.out) / "results.md").read_text())
    heap.close()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = init(args)
    from taxmodel.kernels.ag_gemm.gemm_tiles import GPU_CONFIG
    from taxmodel.kernels.ag_gemm.state import pick_dtype
    from taxmodel.kernels.ag_gemm.workload import AgGemm, heap_bytes

    sizes = args.sizes.split(",") if args.sizes else (CPU_SIZES if args.cpu else GPU_SIZES)
    wl = AgGemm()
    dtype = pick_dtype({}, ctx.device)
    # the final round holds pull's and push's states at once (with --final-every-config, one per config)
    copies = len(gpu_configs("", args.tune_set)) if args.final_every_config and not args.cpu else 1
    need = copies * max(sum(heap_bytes(wl.shape(s, **args.shape_overrides), ctx.world_size, v, dtype, GPU_CONFIG)
                            for v in ("push", "pull")) for s in sizes)
    heap = make_heap(ctx, need + (1 << 20))
    log = (lambda s: print(s, flush=True)) if ctx.rank == 0 else (lambda s: None)
    log(f"ag_gemm benchmark: world {ctx.world_size}, {ctx.device}, sizes {sizes}, heap {need / 2**20:.0f} MiB")
    return run_sizes(ctx, args, sizes, heap, bench_size, write_results, log)


if __name__ == "__main__":
    sys.exit(main())
