"""Flash Decode benchmark: BSP vs fused, correctness at every size, then timings side by side.

GPU (4 ranks, about 3 minutes):
    OUT=out/bench_flash_decode torchrun --nproc-per-node 4 benchmarks/bench_flash_decode.py --spin-timeout 5
CPU smoke test (2 ranks, Triton interpreter, tiny shape, no timing worth reading):
    TRITON_INTERPRET=1 torchrun --nproc-per-node 2 benchmarks/bench_flash_decode.py --cpu

Per size (the workload's presets: KV per rank 1K..256K at batch 1 and 16, 32 query heads with 8:1
GQA, plus one 96-head preset):
1. Tuning: the split-KV kernel plus its local combine (the compute both variants share) is timed
   alone for a few tile configs and wave sizes; rank 0's fastest is used by both variants.
   The fused kernel's structure is swept too (``FUSED_SWEEP``: LL words or flags, the pair's last
   worker combining or dedicated combiner CTAs); the fastest correct one is the ``fused`` column
   and every structure is reported.
2. Correctness: each variant runs once with its output poisoned (NaN) and is compared with the fp32
   reference over the whole gathered KV; after the timed graph replays, fresh inputs, poison, one
   more replay and another check (this catches stale partials across steps).
3. Timing, the same way for both variants: (a) CUDA graphs, which is what a decode loop uses:
   ``--iters`` steps captured in one graph, replayed; (b) eager launches, CUDA events around
   ``--iters`` back-to-back steps. A time is per step, the maximum over ranks (the slowest rank
   sets the pace), median over ``--reps`` replays.
4. Floors: HBM bandwidth measured here by a large device-to-device copy (bytes read + written over
   time); the floor of a size is this rank's KV bytes over that bandwidth. Short KV fits in L2
   (60 MB) and is re-read from there on back-to-back steps, so the floor does not bind there.

Results: results.json and results.md under ``$OUT`` (or ``--out``); rank 0 prints the table.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness import all_max, init as harness_init, rank_timer  # noqa: E402

from taxmodel.runtime import timing  # noqa: E402
from taxmodel.workload import tolerance_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _ensure_taxmodel_kernels() -> None:
    """``taxmodel.kernels`` is the ``kernels/`` folder once installed; alias it when run from a bare
    checkout (e.g. a GPU machine where the package is not pip-installed)."""
    try:
        import taxmodel.kernels  # noqa: F401  (only whether it imports)
        return
    except ModuleNotFoundError:
        pass
    import importlib.util

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location("taxmodel.kernels", ROOT / "kernels" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "kernels")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["taxmodel.kernels"] = module
    spec.loader.exec_module(module)


GPU_SIZES = ["b1-kv1k", "b1-kv4k", "b1-kv16k", "b1-kv64k", "b1-kv256k",
             "b16-kv1k", "b16-kv4k", "b16-kv16k", "b16-kv64k", "b16-kv256k", "h96-b4-kv64k"]
CPU_SIZES = ["tiny"]

#: Configs tried per size: (block_n, num_warps, num_stages, programs per SM the split plan assumes).
#: Shared memory per program on sm_90: 64/4/3 70 KB (3 fit per SM), 64/4/2 38 KB (5), 128/8/2 72 KB (3).
#: The assumption must hold for the fused kernel too, whose combine code takes more registers
#: (Triton 3.6, sm_90, 4 warps: 96 per thread since the combines keep rows first, against the split
#: kernel's 80): 5 programs of 4 warps fit per SM by registers (and by shared
#: memory at 2 stages), and 1 of 8 warps is what the 8-warp build was checked for.
GPU_CANDIDATES = [(64, 4, 3, 3), (64, 4, 3, 2), (64, 4, 3, 1), (64, 4, 2, 3), (64, 4, 2, 2), (64, 4, 2, 5),
                  (128, 8, 2, 1),
                  # deeper pipelines at one or two programs per SM (104 KB at 4 stages, 137 KB at 5):
                  # more KV bytes in flight per SM with few splits (batch 1, long KV)
                  (64, 4, 4, 1), (64, 4, 5, 1), (64, 4, 4, 2)]

#: Dedicated combiners: as many as pairs, at most half the SMs (the fused state caps it).
DEDICATED = 1 << 16

#: Fused-kernel structures swept at every size (label -> shape keys, see workload.fused_config).
#: "flags-dedicated": per-peer system-scope release/acquire flags, combiner CTAs spinning from the
#: kernel's start.
FUSED_SWEEP = {
    "ll-last": dict(fused_protocol=1, fused_combiners=0),
    "ll-dedicated": dict(fused_protocol=1, fused_combiners=DEDICATED),
    "flags-last": dict(fused_protocol=2, fused_combiners=0),
    "flags-dedicated": dict(fused_protocol=2, fused_combiners=DEDICATED),
    "ll-s2": dict(fused_protocol=1, fused_slices=2),
    "ll-s4": dict(fused_protocol=1, fused_slices=4),
    "ll-s8": dict(fused_protocol=1, fused_slices=8),
}

#: BSP combine programs per KV head tried with the fastest tile (each takes G / slices query rows).
BSP_SLICES = (1, 2, 4, 8)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="CPU smoke test (gloo, Triton interpreter, tiny shape)")
    p.add_argument("--sizes", default=None, help="comma-separated presets (default: the whole sweep)")
    p.add_argument("--iters", type=int, default=None, help="steps per timed graph / eager batch")
    p.add_argument("--reps", type=int, default=None, help="timed replays (median reported)")
    p.add_argument("--no-tune", action="store_true", help="default tile config only")
    p.add_argument("--no-eager", action="store_true", help="skip the eager-launch timings")
    p.add_argument("--fused", default=",".join(FUSED_SWEEP),
                   help=f"fused structures to sweep (comma-separated, of {', '.join(FUSED_SWEEP)})")
    p.add_argument("--spin-timeout", type=float, default=30.0)
    p.add_argument("--out", default=os.environ.get("OUT", "out/bench_flash_decode"))
    return p.parse_args(argv)


# --- setup -------------------------------------------------------------------------------------


def init(args: argparse.Namespace):
    """The shared rank context (harness.init) with a 64 MiB symmetric heap for the fused variant."""
    from taxmodel.runtime.heap import make_heap

    ctx = harness_init(args)
    ctx.heap = make_heap(ctx, 64 << 20)
    return ctx


def broadcast_int(value: int, ctx: Any) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=ctx.device)
    dist.broadcast(t, src=0)
    return int(t.item())


# --- timing ------------------------------------------------------------------------------------


def copy_bandwidth(ctx: Any, nbytes: int = 4 << 30) -> float:
    """HBM bandwidth (bytes/s) of a device-to-device copy: every byte read once and written once."""
    if not ctx.is_cuda:
        return float("nan")
    src = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
    bandwidth = timing.copy_bandwidth(src, reps=10)
    del src
    torch.cuda.empty_cache()
    return bandwidth


# --- one size ----------------------------------------------------------------------------------


def tune(ctx: Any, shape: dict, timer: timing.SampleTimer, args: argparse.Namespace) -> tuple[dict, list[dict]]:
    """Fastest (tile, wave) for split-KV + local combine alone; rank 0's choice for every rank."""
    from taxmodel.kernels.flash_decode import combine as cb
    from taxmodel.kernels.flash_decode import split_kv as sk
    from taxmodel.kernels.flash_decode.reference import make_kv_shard, make_query
    from taxmodel.kernels.flash_decode.workload import kv_lengths, planner_sm_count, split_config

    base = split_config(shape, ctx.device)
    if args.cpu or args.no_tune:
        cands = [base]
    else:
        cands = [sk.SplitConfig(block_n=n, num_warps=w, num_stages=s, ctas_per_sm=c)
                 for (n, w, s, c) in GPU_CANDIDATES]
    b, hq, hkv, d = (shape[k] for k in ("batch", "q_heads", "kv_heads", "head_dim"))
    n = kv_lengths(shape, ctx.world_size)[ctx.rank]
    dtype = torch.float16 if shape.get("fp16", 0) else torch.bfloat16
    q = make_query(shape["seed"], b, hq, d, dtype, ctx.device)
    k, v = make_kv_shard(shape["seed"], ctx.rank, b, hkv, n, d, dtype, ctx.device)
    send = torch.empty(cb.packed_size(b * hq, d), dtype=torch.float32, device=ctx.device)

    def time_config(cfg: Any, slices: int) -> dict:
        plan = sk.plan_splits(b, hkv, n, planner_sm_count(ctx.device), cfg)
        a = sk.SplitKVArgs(q, k, v, n, plan, cfg)
        po, pl = sk.partial_buffers(a)

        def step() -> None:
            sk.launch_split_kv(a, po, pl)
            cb.launch_combine_local(a, po, pl, send, slices=slices)

        times, _, _ = timer.graph(step)
        if times is None:  # no graphs here: eager launches (host-bound at short KV, but the same for all)
            times = timer.eager(step)
        return dict(config=cfg.label(), splits=plan.num_splits, combine_slices=slices, ms=statistics.median(times))

    rows = [time_config(cfg, 1) for cfg in cands]
    best = broadcast_int(min(range(len(rows)), key=lambda i: rows[i]["ms"]), ctx)
    cfg = cands[best]
    # The combine's programs per KV head, with that tile (both BSP combines use the choice).
    group = hq // hkv
    slice_rows = [rows[best]] + [time_config(cfg, k) for k in BSP_SLICES if k > 1 and group % k == 0]
    rows += slice_rows[1:]
    pick = broadcast_int(min(range(len(slice_rows)), key=lambda i: slice_rows[i]["ms"]), ctx)
    chosen = dict(block_n=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages, ctas_per_sm=cfg.ctas_per_sm,
                  bsp_slices=slice_rows[pick]["combine_slices"])
    return chosen, rows


def check(wl: Any, ctx: Any, shape: dict, state: Any, ref: torch.Tensor) -> tuple[bool, float, str]:
    """(correct on every rank, this rank's max abs error, problem) for the run that just ended."""
    from taxmodel.errors import RunError

    problem = ""
    try:
        got = wl.output(state).float()  # the fused variant also reads its error buffer here
    except RunError as exc:
        got, problem = None, str(exc)
    err = float("inf")
    if got is not None:
        rtol, atol = tolerance_of(wl, shape, ctx.world_size)  # a sum over ranks in 16 bits grows with them
        if torch.isnan(got).any():
            problem = "NaN left in the output"
        else:
            err = float((got - ref).abs().max())
            if not torch.allclose(got, ref, rtol=rtol, atol=atol):
                problem = f"max error {err:.3g} over tolerance"
    ok = all_max(ctx, 1.0 if problem else 0.0) == 0
    return ok, err, problem


def run_variant(ctx: Any, wl: Any, variant: Any, shape: dict, timer: timing.SampleTimer, args: argparse.Namespace,
                seeds: tuple[int, int], refs: dict, lens: list[int], name: str,
                log: Callable[[str], None]) -> dict:
    """Correctness (eager, seed A), eager and graph timings, correctness after graph replays
    (fresh inputs, seed B) of one variant/structure; a dict of results (no exception escapes)."""
    from taxmodel.kernels.flash_decode.reference import reference_output

    res: dict[str, Any] = dict(graph_ms=float("nan"), eager_ms=float("nan"), correct=False)
    seed_a, seed_b = seeds
    ctx.barrier()
    ctx.heap.reset()
    try:
        state = wl.setup(ctx, shape, variant)
    except Exception as exc:  # noqa: BLE001 - a failing structure is logged and skipped
        from taxmodel.errors import InputError

        res["problem"] = f"setup: {type(exc).__name__}: {exc}"[:300]
        res["inapplicable"] = isinstance(exc, InputError)  # e.g. slices that do not divide this size's group
        log(f"{name}: setup failed ({res['problem']}); skipped")
        return res
    if variant.name == "fused":
        res["combiners"] = state.impl.num_combiners
        res["structure"] = state.impl.config.protocol
    res["splits"] = state.args.plan.num_splits
    step = functools.partial(variant.run, state)

    def checked(seed: int, run: Callable[[], None], err_key: str, when: str) -> bool:
        """Poisoned output, inputs of ``seed``, ``run``, then the check on every rank."""
        if seed not in refs:
            refs[seed] = reference_output(seed, state.q, lens, shape["kv_heads"])
        state.poison()
        ctx.barrier()
        run()
        ok, res[err_key], problem = check(wl, ctx, shape, state, refs[seed])
        res["correct"] = ok
        if not ok:
            log(f"{name}: WRONG {when} on some rank")
            print(f"rank {ctx.rank}: {name} {when}: {problem or 'correct here'}", flush=True)
            res["problem"] = problem
        return ok

    if not checked(seed_a, step, "err", "(eager launch; not timed)"):
        state = step = None  # the buffers go before the next shape (the closures above read these names)
        ctx.barrier()
        return res
    if not args.no_eager:
        res["eager_ms"] = statistics.median(timer.eager(step))
    times, replay, error = timer.graph(step)
    if times is None:
        log(f"{name}: CUDA graph capture failed ({error}); graph columns show eager timings")
        res["graph_error"] = error
        times = timer.eager(step)
    res["graph_ms"] = statistics.median(times)
    res["graph_reps_ms"] = times
    state.reseed(seed_b)
    checked(seed_b, replay, "err_graph", "after graph replays with fresh inputs")
    state = replay = step = None  # the buffers go before empty_cache (the closures above read these names)
    ctx.barrier()
    if ctx.is_cuda:
        torch.cuda.empty_cache()
    return res


def best_fused(runs: dict[str, dict]) -> str | None:
    """The fused structure with the lowest graph time among the correct ones (None if none is)."""
    good = [k for k, r in runs.items() if r.get("correct") and r["graph_ms"] == r["graph_ms"]]
    return min(good, key=lambda k: runs[k]["graph_ms"]) if good else None


def bench_size(ctx: Any, preset: str, args: argparse.Namespace, hbm_bw: float, log: Callable[[str], None]) -> dict:
    from taxmodel.kernels.flash_decode.workload import FlashDecode, kv_lengths

    wl = FlashDecode()
    seeds = tuple(broadcast_int(random.randrange(2**31 - 1), ctx) for _ in range(2))
    shape = wl.shape(preset, seed=seeds[0])
    timer = rank_timer(ctx, args.iters, args.reps)
    t0 = time.monotonic()
    tuned, tune_rows = tune(ctx, shape, timer, args)
    shape.update(tuned)
    lens = kv_lengths(shape, ctx.world_size)
    dtype = torch.float16 if shape.get("fp16", 0) else torch.bfloat16
    row: dict[str, Any] = dict(size=preset, shape=dict(shape), tuned=tuned, tuning=tune_rows)
    refs: dict[int, torch.Tensor] = {}
    variants = wl.variants()
    bsp = run_variant(ctx, wl, variants["bsp"], shape, timer, args, seeds, refs, lens, f"{preset}/bsp", log)
    runs = {}
    for label in args.fused.split(","):
        runs[label] = run_variant(ctx, wl, variants["fused"], dict(shape, **FUSED_SWEEP[label]), timer,
                                  args, seeds, refs, lens, f"{preset}/fused {label}", log)
    row["fused_runs"] = runs
    best = best_fused(runs)
    row["fused_config"] = best or "-"
    fused = runs[best] if best else dict(graph_ms=float("nan"), eager_ms=float("nan"), correct=False)
    for name, res in (("bsp", bsp), ("fused", fused)):
        for key in ("graph_ms", "eager_ms", "correct", "err", "err_graph", "problem", "graph_error", "splits",
                    "graph_reps_ms"):
            if key in res:
                row[f"{name}_{key}"] = res[key]
    row["fused_correct"] = best is not None and all(r.get("correct") or r.get("inapplicable") for r in runs.values())
    b, hkv, d = shape["batch"], shape["kv_heads"], shape["head_dim"]
    kv_bytes = 2 * b * hkv * lens[ctx.rank] * d * dtype.itemsize
    row["kv_bytes_per_rank"] = kv_bytes
    row["floor_ms"] = kv_bytes / hbm_bw * 1e3 if hbm_bw == hbm_bw else float("nan")
    row["split_only_ms"] = min(r["ms"] for r in tune_rows)
    for v in ("bsp", "fused"):
        row[f"{v}_bw_tbs"] = kv_bytes / (row[f"{v}_graph_ms"] * 1e-3) / 1e12
        row[f"{v}_pct_floor"] = 100.0 * row["floor_ms"] / row[f"{v}_graph_ms"]
    for res in runs.values():
        res["speedup_graph"] = row["bsp_graph_ms"] / res["graph_ms"]
        res["pct_floor"] = 100.0 * row["floor_ms"] / res["graph_ms"]
    row["speedup_graph"] = row["bsp_graph_ms"] / row["fused_graph_ms"]
    if not args.no_eager:
        row["speedup_eager"] = row["bsp_eager_ms"] / row["fused_eager_ms"]
    row["seconds"] = time.monotonic() - t0
    sweep = ", ".join(f"{k} {r['graph_ms'] * 1e3:.1f}" for k, r in runs.items())
    log(f"{preset}: bsp {row['bsp_graph_ms'] * 1e3:.1f} us, fused {row['fused_graph_ms'] * 1e3:.1f} us [{best}] "
        f"(graph), x{row['speedup_graph']:.2f}, fused {row['fused_pct_floor']:.0f}% of floor, "
        f"tile {tuned}; sweep (us): {sweep}; {row['seconds']:.1f} s")
    return row


# --- output ------------------------------------------------------------------------------------


def _verdict(row: dict) -> str:
    """'yes', or which variant/structure was wrong; notes graph captures that fell back to eager."""
    runs = row.get("fused_runs", {})
    wrong = (["bsp"] if not row.get("bsp_correct", False) else []) + [
        f"fused {k}" for k, r in runs.items() if not r.get("correct", False) and not r.get("inapplicable")]
    text = "yes" if not wrong else "WRONG: " + ", ".join(wrong)
    fell_back = (["bsp"] if "bsp_graph_error" in row else []) + [
        f"fused {k}" for k, r in runs.items() if "graph_error" in r]
    if fell_back:
        text += f" (no graph for {', '.join(fell_back)}: eager)"
    return text


def _us(ms: float) -> str:
    return "-" if ms != ms else f"{ms * 1e3:.1f}"


def markdown(rows: list[dict], meta: dict) -> str:
    head = ("| size | KV/rank (MB) | floor (us) | split+combine alone (us) | bsp graph (us) | fused graph (us) | "
            "fused structure | speedup graph | fused % floor | fused TB/s | bsp eager (us) | fused eager (us) | "
            "speedup eager | tile | correct |")
    lines = [f"# Flash decode, {meta['world_size']} ranks, {meta['device']}", "",
             f"HBM copy bandwidth {meta['hbm_tbs']:.2f} TB/s (device-to-device copy, read + write). "
             f"Graph: {meta['iters']} steps per CUDA graph, eager: {meta['iters']} back-to-back launches; "
             f"per-step time, max over ranks, median of {meta['reps']}. The fused columns are the fastest "
             "correct fused structure of the sweep below (its eager time is that structure's). Tile: the "
             "split kernel's block_n, warps, stages, programs per SM, and kK: the BSP combines' programs per "
             "KV head, all tuned on split + local combine alone.", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        eager = (f"{_us(r['bsp_eager_ms'])} | {_us(r['fused_eager_ms'])} | "
                 f"{r.get('speedup_eager', float('nan')):.2f}" if "bsp_eager_ms" in r else "- | - | -")
        t = r["tuned"]
        lines.append(
            f"| {r['size']} | {r['kv_bytes_per_rank'] / 1e6:.1f} | {r['floor_ms'] * 1e3:.1f} | "
            f"{r['split_only_ms'] * 1e3:.1f} | {_us(r['bsp_graph_ms'])} | {_us(r['fused_graph_ms'])} | "
            f"{r['fused_config']} | {r['speedup_graph']:.2f} | {r['fused_pct_floor']:.0f}% | {r['fused_bw_tbs']:.2f} | "
            f"{eager} | n{t['block_n']} w{t['num_warps']} s{t['num_stages']} c{t['ctas_per_sm']} "
            f"k{t.get('bsp_slices', 1)} | {_verdict(r)} |")
    labels = list(dict.fromkeys(k for r in rows for k in r.get("fused_runs", {})))
    if labels:
        lines += ["", "## Fused structures", "",
                  "Graph time per step in us (speedup over bsp graph); eager in the second table. ll: LL words "
                  "(value + epoch in one 8-byte store, no fence); flags: fp32 pushes, a system-scope release "
                  "flag per peer, an acquire per peer. last: each head group's last worker combines the ranks' "
                  "partials; dedicated: one combiner CTA per head group (at most half the SMs) spinning from "
                  "the kernel's start. sK: spread, K slice "
                  "combiner CTAs per head group, each combining, pushing and merging G/K query heads.", "",
                  "| size | bsp | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 2)]
        for r in rows:
            cells = []
            for k in labels:
                run = r.get("fused_runs", {}).get(k)
                if run is None:
                    cells.append("-")
                elif run.get("inapplicable"):
                    cells.append("n/a")
                elif not run.get("correct"):
                    cells.append("WRONG")
                else:
                    cells.append(f"{_us(run['graph_ms'])} ({run['speedup_graph']:.2f}x)")
            lines.append(f"| {r['size']} | {_us(r['bsp_graph_ms'])} | " + " | ".join(cells) + " |")
        if any(not math.isnan(r.get("bsp_eager_ms", float("nan"))) for r in rows):
            lines += ["", "| size (eager, us) | bsp | " + " | ".join(labels) + " |", "|" + "---|" * (len(labels) + 2)]
            for r in rows:
                runs = r.get("fused_runs", {})
                cells = [_us(runs[k]["eager_ms"]) if k in runs else "-" for k in labels]
                lines.append(f"| {r['size']} | {_us(r.get('bsp_eager_ms', float('nan')))} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(out: Path, rows: list[dict], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str))
    (out / "results.md").write_text(markdown(rows, meta))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = [k for k in args.fused.split(",") if k not in FUSED_SWEEP]
    if unknown:
        raise SystemExit(f"--fused: unknown structure(s) {', '.join(unknown)}; choose from {', '.join(FUSED_SWEEP)}")
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    _ensure_taxmodel_kernels()
    args.iters = args.iters or (2 if args.cpu else 20)
    args.reps = args.reps or (2 if args.cpu else 7)
    ctx = init(args)
    log = (lambda s: print(s, flush=True)) if ctx.rank == 0 else (lambda s: None)
    random.seed(int.from_bytes(os.urandom(8), "little"))
    sizes = args.sizes.split(",") if args.sizes else (CPU_SIZES if args.cpu else GPU_SIZES)
    started = time.monotonic()
    hbm_bw = copy_bandwidth(ctx)
    log(f"HBM copy bandwidth: {hbm_bw / 1e12:.2f} TB/s")
    meta = dict(world_size=ctx.world_size, device=torch.cuda.get_device_name(ctx.device) if ctx.is_cuda else "cpu",
                hbm_bytes_per_s=hbm_bw, hbm_tbs=hbm_bw / 1e12, iters=args.iters, reps=args.reps,
                timing="CUDA graphs (primary) and CUDA events around eager launches; per step, max over ranks, median",
                torch=torch.__version__, fused_sweep=args.fused.split(","))
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    rows: list[dict] = []
    for preset in sizes:
        try:
            rows.append(bench_size(ctx, preset, args, hbm_bw, log))
        except Exception as exc:  # noqa: BLE001 - one failing size is logged, the others still run
            log(f"{preset}: FAILED ({type(exc).__name__}: {exc}); skipped")
            print(f"rank {ctx.rank}: {preset}: {type(exc).__name__}: {exc}", flush=True)
            if ctx.is_cuda:
                torch.cuda.synchronize()
            ctx.barrier()
        meta["seconds"] = time.monotonic() - started
        if ctx.rank == 0:  # after every size, so a run cut short still leaves its finished sizes
            write_results(Path(args.out), rows, meta)
    if ctx.rank == 0:
        print(markdown(rows, meta), flush=True)
        print(f"wrote {Path(args.out) / 'results.json'} and {Path(args.out) / 'results.md'} in "
              f"{meta['seconds']:.0f} s", flush=True)
    harness.close(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
