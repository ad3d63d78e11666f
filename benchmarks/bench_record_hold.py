"""Where a record's cost comes from: records held in registers (the tree's ``kernels/_trace.py``)
against records stored at each mark, same process, same inputs, CUDA-graph replays interleaved.

States per flash decode size (fused variant), each set up like ``bench_instrument``'s:
  plain    INSTRUMENT=0: no record code
  held     the tree's ``mark``/``finish``: a CTA keeps its records in registers and writes them
           out when a window is full and at its end (after its last release)
  at_mark  the same records, each stored by ``mark`` as it is made (``finish`` writes nothing):
           what the records cost before they were held
  clock    the barrier and the clock read of every mark, nothing stored (the floor)
``mark``/``finish`` are swapped before each state's first launch (the JIT resolves them when it
compiles); every instrumented state gets its own ``INSTRUMENT`` code (records per CTA id x1, x2,
x4), so no state reuses another's binary. After the warm-up each state's buffer is checked for
the records it should hold (held and at_mark the same count, clock none): proof that the swap took.

GPU (2 or 4 ranks, about a minute):
    torchrun --standalone --nproc-per-node 2 benchmarks/bench_record_hold.py --out $OUT/record_hold
CPU smoke (2 ranks, interpreter; times mean nothing):
    TRITON_INTERPRET=1 torchrun --standalone --nproc-per-node 2 benchmarks/bench_record_hold.py --cpu --sizes tiny
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import bench_instrument as bi  # noqa: E402
from bench_flash_decode import Timer, _ensure_taxmodel_kernels, init  # noqa: E402

_ensure_taxmodel_kernels()
from taxmodel.kernels import _sync, _trace  # noqa: E402
from taxmodel.runtime import records  # noqa: E402

KB = _trace._K_BITS_C
KM = _trace._K_MASK
CM = _trace._CLOCK_MASK
HC = _trace._HEADER_C


@triton.jit
def mark_at_mark(rec_ptr, cta, phase, state, INSTRUMENT: tl.constexpr, MODE: tl.constexpr):
    """The record stored as it is made (fixed slots, a layout code's constant sizes): four
    8-byte stores right after the clock read, as ``mark`` did before records were held."""
    if INSTRUMENT:
        t_start, held, keys = state
        ctas = INSTRUMENT // 65536
        per_cta = INSTRUMENT % 65536
        tl.debug_barrier()
        now = _sync.now(MODE)
        k = t_start & KM
        start = (t_start >> KB) & CM
        cta64 = tl.cast(cta, tl.int64)
        slot = cta64 * per_cta + k
        ok = (k < per_cta) & (cta64 >= 0) & (cta64 < ctas)
        if ok:
            base = rec_ptr + HC + slot * 4
            tl.store(base, cta64)
            tl.store(base + 1, tl.cast(phase, tl.int64) + 1)
            tl.store(base + 2, start)
            tl.store(base + 3, now)
        else:
            tl.atomic_add(rec_ptr, tl.full((), 1, tl.int64), sem="relaxed", scope="gpu")
        state = ((now << KB) | tl.minimum(k + 1, KM), held, keys)
    return state


@triton.jit
def mark_clock(rec_ptr, cta, phase, state, INSTRUMENT: tl.constexpr, MODE: tl.constexpr):
    """Barrier and clock read only (no record kept)."""
    if INSTRUMENT:
        t_start, held, keys = state
        tl.debug_barrier()
        now = _sync.now(MODE)
        state = ((now << KB) | tl.minimum((t_start & KM) + 1, KM), held, keys)
    return state


@triton.jit
def finish_nothing(rec_ptr, state, INSTRUMENT: tl.constexpr, MODE: tl.constexpr):
    """Nothing held: the at_mark and clock states write nothing at the end."""
    pass


TREE = (_trace.mark, _trace.finish)
SWAPS = {"held": TREE, "at_mark": (mark_at_mark, finish_nothing), "clock": (mark_clock, finish_nothing)}
FACTOR = {"held": 1, "at_mark": 2, "clock": 4}  # per_cta multiplier: a distinct INSTRUMENT code per state


class ScaledBook(records.RecordBook):
    """A record book whose layouts have ``factor`` x the records per CTA id (another code)."""

    def __init__(self, factor: int) -> None:
        super().__init__()
        self.factor = factor

    def buffer(self, name, layout, device, mode):
        lay = records.as_layout(layout)
        return super().buffer(name, _trace.RecordLayout(lay.ctas, lay.per_cta * self.factor), device, mode)


def _swap(name: str) -> None:
    _trace.mark, _trace.finish = SWAPS[name]


def records_written(buf: torch.Tensor) -> int:
    """Slots holding a record (phase word 1 .. number of phases)."""
    ph = buf[_trace.HEADER:].detach().cpu().view(-1, _trace.RECORD_WORDS)[:, 1]
    return int(((ph >= 1) & (ph <= len(_trace.PHASES))).sum())


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--sizes", default="b1-kv1k,b16-kv1k,b1-kv16k,b16-kv16k")
    p.add_argument("--states", default="held,at_mark,clock", help="instrumented states to compare with plain")
    p.add_argument("--iters", type=int, default=20, help="steps per graph")
    p.add_argument("--reps", type=int, default=31, help="interleaved replays per state (median)")
    p.add_argument("--spin-timeout", type=float, default=5.0)
    p.add_argument("--watchdog", type=float, default=0.0, help="dump stacks and exit after this many s")
    p.add_argument("--out", default=os.environ.get("OUT", "out/record_hold"))
    return p.parse_args(argv)


def run_size(ctx, size: str, names: list[str], args, log) -> dict:
    case = bi.flash_decode_cases([size])[0]
    wl = bi.make_workload(case, ctx)
    v = wl.variants()[case.variant]
    shape = wl.shape(size)
    ctx.heap.reset()
    states, written = {}, {}
    ctx.instrument = False
    states["plain"] = wl.setup(ctx, shape, v)
    for name in names:
        _swap(name)
        ctx.records = ScaledBook(FACTOR[name])
        ctx.instrument = True
        states[name] = wl.setup(ctx, shape, v)
        ctx.instrument = False
        for _ in range(2):  # compiles with this state's mark/finish
            v.run(states[name])
        ctx.synchronize()
        _swap("held")
        (buf,) = ctx.records.buffers.values()  # the fused kernel's, this state's book
        written[name] = records_written(buf.scratch)
    _swap("held")
    for name, st in states.items():
        for _ in range(2):
            v.run(st)
        ctx.synchronize()
        bi._check_output(ctx, wl, shape, st, case, name)
    log(f"[{time.strftime('%H:%M:%S')}] {size}: set up; records per launch {written}")
    timer = Timer(ctx, args.iters, 1)
    replays = {}
    for name, st in states.items():
        times, replay, error = timer.graph(lambda st=st: v.run(st))
        if times is None:
            return {"size": size, "error": f"capture of {name}: {error}"}
        replays[name] = replay
    order = list(replays)
    times = {k: [] for k in order}
    for rep in range(args.reps):
        rot = order[rep % len(order):] + order[:rep % len(order)]
        for name in rot:
            times[name].append(timer._reps(replays[name])[0])
    problem = bi._phase_errors(ctx, states, case, "graph")
    med = {k: statistics.median(x) for k, x in times.items()}
    row = {"size": size, "median_us": {k: m * 1e3 for k, m in med.items()},
           "overhead_pct": {k: (med[k] / med["plain"] - 1) * 100 for k in names},
           "min_us": {k: min(x) * 1e3 for k, x in times.items()}, "all_ms": times,
           "records_per_launch": written, "error": problem}
    ctx.synchronize()
    ctx.barrier()
    return row


def check_swaps(rows: list[dict]) -> list[str]:
    """Why a row's states did not hold what they should (the swap did not take), if so. The counts
    of held and at_mark need not be equal: a pair's last worker differs from launch to launch, so
    the filled slots of two launches differ (slots a later launch did not reach keep older records)."""
    bad = []
    for r in rows:
        w = r.get("records_per_launch", {})
        bad += [f"{r['size']}: {k} wrote no records" for k in ("held", "at_mark") if k in w and w[k] == 0]
        if w.get("clock", 0):
            bad.append(f"{r['size']}: clock wrote {w['clock']} records")
    return bad


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.watchdog > 0:
        faulthandler.dump_traceback_later(args.watchdog, repeat=False, exit=True)
    ctx = init(args)
    log = (lambda s: print(s, flush=True)) if ctx.rank == 0 else (lambda s: None)
    names = [x for x in args.states.split(",") if x]
    unknown = sorted(set(names) - set(SWAPS))
    if unknown:
        raise SystemExit(f"unknown state(s) {unknown}; choose from {sorted(SWAPS)}")
    out = Path(args.out)
    rows = []
    for size in [s for s in args.sizes.split(",") if s]:
        try:
            rows.append(run_size(ctx, size, names, args, log))
        except Exception as exc:  # noqa: BLE001 - the other sizes still run
            print(f"rank {ctx.rank}: {size}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}", flush=True)
            rows.append({"size": size, "error": f"{type(exc).__name__}: {exc}"})
            _swap("held")
        if ctx.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            (out / "results.json").write_text(json.dumps({"iters": args.iters, "reps": args.reps, "rows": rows},
                                                         indent=1) + "\n")
    bad = check_swaps(rows)
    if ctx.rank == 0:
        dev = torch.cuda.get_device_name() if ctx.is_cuda else "cpu"
        print(f"\nrecord write path, flash_decode fused, CUDA graphs of {args.iters} steps, median of {args.reps} "
              f"interleaved replays, max over {ctx.world_size} ranks ({dev}); us per step (overhead vs plain)")
        head = "| size | plain | " + " | ".join(names) + " | records/launch |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for r in rows:
            if "median_us" not in r:
                print(f"| {r['size']} | ERROR {r.get('error', '')[:150]} |")
                continue
            cells = [f"{r['median_us'][k]:.2f} ({r['overhead_pct'][k]:+.2f} %)" for k in names]
            print(f"| {r['size']} | {r['median_us']['plain']:.2f} | " + " | ".join(cells)
                  + f" | {r['records_per_launch']} |" + (f" gave up: {r['error'][:100]}" if r["error"] else ""))
        for b in bad:
            print(f"SWAP CHECK FAILED: {b}")
    return 0 if all("median_us" in r and not r["error"] for r in rows) and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
